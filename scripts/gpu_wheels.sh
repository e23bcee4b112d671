#!/usr/bin/env bash
# Wheels of the small pure-Python dependencies the GPU machine lacks (pydantic and what it needs:
# tidal.model's configs are pydantic sections), downloaded here for the device's Linux x86_64
# CPython 3.10-3.13 into a git-ignored folder that travels with the run:
#
#   bash scripts/gpu_wheels.sh              # here, with network; then run the device script with
#                                           # carry=[".gpu-wheels"]: scripts/gpu_numerics.sh
#                                           # installs from it offline (pip --no-index)
#
# Pinned to the pydantic this checkout's environment runs (pydantic pins its pydantic-core).
set -euo pipefail
DEST="${WHEELS_DIR:-.gpu-wheels}"
PY="${PYTHON:-python3}"
VERSION=$("$PY" -c "import pydantic; print(pydantic.VERSION)")
mkdir -p "$DEST"
for pyver in 3.10 3.11 3.12 3.13; do
    "$PY" -m pip download --quiet "pydantic==$VERSION" --only-binary=:all: \
        --platform manylinux2014_x86_64 --implementation cp --python-version "$pyver" -d "$DEST"
done
ls -1 "$DEST"
du -sh "$DEST"
