#!/usr/bin/env bash
# The GPU checks of the code that has not run on a GPU yet, in one device call on the H200 (~6 min):
#   1. the GPU tests of the cuda grouped-MoE member (moe_mma), the dense split-K / SwiGLU / MXFP4
#      forms and FP4MLP, the no-sync forwards and the shared scratch pool (issue #26);
#   2. bench/cuda_moe_h200.py: every moe_mma config at GLM-5 TP8 routed shapes vs float64, and the
#      per-kernel table beside Triton's moe_decode and the byte time (its own GPU tests skipped: step 1 ran them).
# What passes here decides two flags: tactics/cuda/moe.py GPU_CHECKED (moe_mma) and
# tactics/cuda/family.py DENSE_SPLIT_GPU_CHECKED (the dense split-K/SwiGLU/MXFP4 forms); until they are
# set, the search leaves those tactics unmeasured (verdict `unknown`).
# Run from the repo root with the wheels of ../shared/tools/device-wheels.sh (plus platformdirs) in .whl/:
#   OUT=DIR bash bench/h200_new_code.sh            (the device tool sets OUT)
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
rc=0
timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -m "gpu or requires_sm90" \
    tests/test_cuda_moe_gpu.py tests/test_cuda_gpu.py tests/test_mlp.py tests/test_nosync_gpu.py tests/test_nn.py \
    > "$OUT/gpu-tests.txt" 2>&1 || rc=1
tail -40 "$OUT/gpu-tests.txt"
timeout "${BENCH_S:-300}" python3 bench/cuda_moe_h200.py --out "$OUT" --no-tests --budget-s "${BUDGET_S:-170}" \
    2>&1 | tail -60 | tee "$OUT/cuda-moe.txt" || rc=1
exit $rc
