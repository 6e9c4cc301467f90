#!/usr/bin/env bash
# Download the pure-Python wheels the GPU suite (bench/gpu/run.sh) may need on a machine without
# network: the GPU session carries bench/gpu/wheels (git-ignored) and run.sh's setup stage
# installs from it only what that machine lacks.
#
# Run here, before a GPU session:   bash bench/gpu/prepare.sh
# then give the session:            carry: ["bench/gpu/wheels"]
#
# The list is what the GPU tests, `longtail profile` and bench/gpu/weight_sync_gpu.py import
# beyond torch, triton and transformers (and transformers' own numpy, pyyaml, safetensors), with
# pytest and its plugins; the versions are this checkout's virtual environment's, so the GPU
# machine runs what the CPU suite ran. Only py3-none-any wheels: they install on any Python 3.
# torch, triton and transformers are never downloaded (the GPU machine has its own builds).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=$ROOT/bench/gpu/wheels
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
DISTS=(
    pytest pluggy iniconfig pygments packaging pytest-timeout
    prometheus-client httpx httpcore h11 anyio sniffio idna certifi
    starlette uvicorn click tenacity rich markdown-it-py mdurl python-multipart typing-extensions
    math-verify latex2sympy2_extended antlr4-python3-runtime
)

mkdir -p "$DEST" || exit 1
# The installed version of each distribution (pinned downloads); a missing one is left unpinned.
mapfile -t PINS < <("$PYTHON" - "${DISTS[@]}" <<'PY'
import sys
from importlib import metadata

for dist in sys.argv[1:]:
    try:
        print(f"{dist}=={metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(dist)
PY
)
echo "downloading into $DEST: ${PINS[*]}"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --dest "$DEST" "${PINS[@]}" || exit 1

bad=0
for wheel in "$DEST"/*.whl; do
    case "$wheel" in
        *-none-any.whl) ;;
        *) echo "not pure Python (would not install on another Python): $wheel" >&2; bad=1 ;;
    esac
done
du -sh "$DEST"
exit "$bad"
