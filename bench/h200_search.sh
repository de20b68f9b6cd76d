#!/usr/bin/env bash
# The full search path on a real GPU in one device call (results: docs/search.md, docs/triton-h200.md,
# docs/report-example/):
#   1. tests/test_workers_gpu.py: a sticky CUDA error (illegal address) costs one worker only;
#   2. `autotune search --model glm5 --tp 8 --families triton,torch` over every hybrid bucket to
#      8192, through the compile pool, isolated workers and successive halving;
#   3. dispatch of every dense winner checked against float64, and which rung answered;
#   4. `autotune report --measure-ceilings`, packed with the cache into $OUT/h200.tgz.
# Run from the repo root with the wheels from ../shared/tools/device-wheels.sh in .whl/.
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d); DB=$W/h200.db
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, sqlalchemy; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$OUT/env.txt"

timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_workers_gpu.py 2>&1 | tail -4 | tee "$OUT/pytest.txt"

t0=$(date +%s.%N)
timeout "${SEARCH_TIMEOUT:-330}" python3 -m autotune.cli search --model glm5 --tp 8 --families triton,torch --cache "$DB" \
    --budget-s "${BUDGET_S:-0.5}" ${MAXT:+--max-tactics $MAXT} --compile-workers 16 --json > "$OUT/search.json" 2> "$W/search.err"
rc=$?; t1=$(date +%s.%N)
echo "search exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s" | tee "$OUT/search.txt"
tail -3 "$W/search.err"
python3 bench/trial_timeline.py "$DB" | tee -a "$OUT/search.txt"
python3 bench/dispatch_check.py "$DB" | tee "$OUT/dispatch.txt"
timeout 120 python3 -m autotune.cli report --cache "$DB" --model glm5 --tp 8 --measure-ceilings -o "$W/report" 2>&1 | tail -3
tar czf "$OUT/h200.tgz" -C "$W" h200.db report
ls -la "$OUT"
