#!/usr/bin/env bash
# The GPU-marked tests, on the H200 through the device tool (CI has no GPU). Carry .whl (SQLAlchemy,
# platformdirs: ../shared/tools/device-wheels.sh platformdirs). Writes the log to $OUT/gpu-tests.log.
#   run: bash bench/h200_gpu_tests.sh [extra pytest args]
set -u
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH="$S:$PWD" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -m "gpu or requires_sm90" "$@" tests 2>&1 | tee "${OUT:-.}/gpu-tests.log"
