#!/usr/bin/env bash
# Issue #16's done-condition on the H200 in one device call, plus the GPU tests of the merged bound,
# batch-invariant, cuda and FP4MoE work (results: docs/cuda-family.md):
#   1. autotune search --model glm5 --tp 8 --families cuda,triton,torch --only dense --max-tokens 64
#      with --strategy ranked (the committed sm90 rank model; the cuda family is new to it, so its
#      tactics are measured first), cut at SEARCH_S seconds (finished jobs stay in the cache);
#   2. bench/cuda_dispatch.py: FP4Linear on that cache (family, tactic, layout, float64 check);
#   3. the GPU-marked tests of tests/test_{bound,batch_invariant,cuda_gpu,moe_block}.py.
# Run from the repo root with the wheels in .whl/:  OUT=DIR bash bench/cuda_search_h200.sh
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$(mktemp -d) AUTOTUNE_CUDA_CUBINS=$(mktemp -d)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
t0=$(date +%s)
timeout "${SEARCH_S:-100}" python3 -m autotune.cli search --model glm5 --tp 8 --families cuda,triton,torch --only dense \
    --max-tokens 64 --strategy ranked --rank-model docs/data/h200x2-glm5-tp8-full.rank-sm90.json \
    --cache "$OUT/cuda-search.db" --budget-s "${BUDGET_S:-0.1}" --compile-workers 16 > "$OUT/search.txt" 2> "$OUT/search.err"
echo "search: exit $?, wall $(( $(date +%s) - t0 )) s" | tee "$OUT/summary.txt"
python3 -m autotune.cli show --cache "$OUT/cuda-search.db" > "$OUT/show.txt" 2>&1
AUTOTUNE_CACHE=$OUT/cuda-search.db timeout 40 python3 bench/cuda_dispatch.py --out "$OUT" > "$OUT/dispatch.txt" 2>&1
echo "dispatch: exit $?" | tee -a "$OUT/summary.txt"
timeout "${TESTS_S:-90}" python3 -m pytest -q -p no:cacheprovider -m "gpu or requires_sm90" tests/test_bound.py \
    tests/test_batch_invariant.py tests/test_cuda_gpu.py tests/test_moe_block.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?" | tee -a "$OUT/summary.txt"; tail -3 "$OUT/gpu-tests.log"
