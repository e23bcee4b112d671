#!/usr/bin/env bash
# Set up tidal in ./.venv on a fresh machine: Python >= 3.11, pip, nothing else by hand.
# Installs the CPU build of torch 2.13.0 only where no torch is importable (a GPU user keeps
# theirs: the venv then sees the system's packages), then tidal itself with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing the CPU build of torch 2.13.0" >&2
  "$VPY" -m pip install -q --disable-pip-version-check torch==2.13.0
fi
"$VPY" -m pip install -q --disable-pip-version-check -e ".[test]"
