#!/usr/bin/env bash
# Issue #18 on the H200 in one device call (results: docs/search.md):
#   1. `autotune search --model glm5 --tp 8 --strategy ranked` twice, each into an empty cache (run a
#      with an empty Triton cache, run b reusing a's compiled kernels), every hybrid bucket to 8192,
#      with the committed rank model (docs/data/h200x2-glm5-tp8-full.rank-sm90.json);
#   2. bench/rank_h200.py compare: winners that differ, re-timed together, interleaved;
#   3. bench/rank_h200.py autotune: a triton.autotune sample, extrapolated.
# Each step has a hard time limit (RUN_A_S, RUN_B_S): a search cut by it keeps the jobs it finished
# (every trial commits on its own) and the comparison covers the (problem, bucket) both finished.
# Run from the repo root with the wheels in .whl/.
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=$(mktemp -d)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$(mktemp -d)
MODEL=docs/data/h200x2-glm5-tp8-full.rank-sm90.json
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$OUT/env.txt"
for run in a b; do
  lim=RUN_${run^^}_S; t0=$(date +%s.%N)
  timeout "${!lim:-120}" python3 -m autotune.cli search --model glm5 --tp 8 --strategy ranked --rank-model "$MODEL" \
      --cache "$W/$run.db" --budget-s "${BUDGET_S:-0.1}" --compile-workers 16 > "$OUT/search-$run.txt" 2> "$W/$run.err"
  rc=$?; t1=$(date +%s.%N)
  echo "run $run: exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s" | tee -a "$OUT/summary.txt"
  tail -2 "$W/$run.err"
  python3 -c "
import sqlite3,sys; c=sqlite3.connect('$W/$run.db')
print('run $run:', c.execute(\"select count(*) from trials where status in ('ok','dropped')\").fetchone()[0], 'timed trials,',
      c.execute('select count(*) from winners').fetchone()[0], 'winners')" | tee -a "$OUT/summary.txt"
done
timeout 30 python3 bench/rank_h200.py compare "$W/a.db" "$W/b.db" --json "$OUT/compare.json" | tee -a "$OUT/summary.txt"
timeout 40 python3 bench/rank_h200.py autotune --json "$OUT/autotune.json" | tee -a "$OUT/summary.txt"
tar czf "$OUT/caches.tgz" -C "$W" a.db b.db
ls -la "$OUT"
