#!/usr/bin/env bash
# Where the cuda grouped-MoE kernels' time goes at M = 1 (issue #26: the "why" of the missed stage
# targets), in one device call on the H200:
#   1. Nsight Compute (--clock-control none, caches flushed before each pass, --set full) on one
#      launch of each served M = 1 kernel (w13:swiglu, w2:reduce, the shared expert's gate_up:swiglu
#      and down), of w13:swiglu at M = 16 and of w2:reduce at M = 16 and 64 (with its alignment launch):
#      bench/moe_latency_h200.py --ncu-launch;
#      → $OUT/ncu_details.txt (every section), $OUT/ncu_source.csv.gz (per-SASS-line stall samples);
#   2. bench/moe_latency_h200.py: the stage probes and the config sweep → $OUT/moe_latency.json.
# Run from the repo root with .whl carried (../shared/tools/device-wheels.sh platformdirs):
#   OUT=DIR [BASELINE=SRC] [STORE=DB] [NCU=0] bash bench/h200_moe_latency.sh
# BASELINE: a folder with another revision's mma_common.cuh and moe_mma.cu, timed beside (--baseline);
# STORE: the sweep's trials also go to this SQLite cache (--store); NCU=0 skips step 1.
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export AUTOTUNE_CUDA_CUBINS=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) AUTOTUNE_PDL=${AUTOTUNE_PDL:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d)/moe
[ "${NCU:-1}" != 0 ] && timeout 240 ncu --clock-control none --cache-control all --profile-from-start off --set full \
    --import-source no -f -o "$R" python3 bench/moe_latency_h200.py --ncu-launch 2>&1 | tail -5
if [ -f "$R.ncu-rep" ]; then
  ncu -i "$R.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
  ncu -i "$R.ncu-rep" --page details --csv > "$OUT/ncu_details.csv" 2>&1
  ncu -i "$R.ncu-rep" --page source --print-source sass --csv 2> "$OUT/ncu_source.err" | gzip > "$OUT/ncu_source.csv.gz"
  grep -E "moe_mma|w4a16_mma|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy" "$OUT/ncu_details.txt" | head -60
fi
BASE=()
[ -n "${BASELINE:-}" ] && BASE=(--baseline "$BASELINE")
[ -n "${STORE:-}" ] && BASE+=(--store "$STORE")
timeout "${SWEEP_TIMEOUT:-330}" python3 bench/moe_latency_h200.py --out "$OUT" --budget-s "${SWEEP_BUDGET:-240}" "${BASE[@]}" 2>&1 | tail -40
