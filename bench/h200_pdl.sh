#!/usr/bin/env bash
# Issue #26 item 7 in one device call on the H200, then the README's main job on the same code:
#   1. the PDL GPU tests and the cuda family's GPU tests (float64, graphs, no-sync) on this code;
#   2. bench/pdl_h200.py: the 24-layer chain, PDL off/on,
#      on the committed main-job cache's winners → $OUT/pdl-h200.json;
#   3. bench/moe_host.py --device cuda with AUTOTUNE_PDL=1 and 0 (host µs per eager FP4MoE forward);
#   4. (MAIN=1, the default) bench/h200_main_job.sh with WHOLE/MAX64 as given (files: 8 at most come back).
# The tests and host figures go to $OUT/summary.txt, which the main job appends to.
# Run from the repo root with .whl carried (../shared/tools/device-wheels.sh platformdirs):
#   OUT=DIR bash bench/h200_pdl.sh
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export AUTOTUNE_CUDA_CUBINS=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_pdl_gpu.py tests/test_cuda_gpu.py \
    tests/test_cuda_moe_gpu.py tests/test_nosync_gpu.py 2>&1 | grep -E "^E |passed|failed" | head -12 | tee -a "$OUT/summary.txt"
db=$(mktemp) && xz -dc docs/data/main-job-h200.db.xz > "$db"
timeout 200 python3 bench/pdl_h200.py --cache "$db" --layers 24 --ms 1,4,16 --json "$OUT/pdl-h200.json" 2>&1 | tail -9
for p in 1 0; do
  AUTOTUNE_PDL=$p timeout 60 python3 bench/moe_host.py --device cuda --experts 32 --profile 0 2>&1 | tail -4 | sed "s/^/pdl=$p /"
done | tee -a "$OUT/summary.txt"
if [ "${MAIN:-1}" = 1 ]; then
  bash bench/h200_main_job.sh
fi
