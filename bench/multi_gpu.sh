#!/usr/bin/env bash
# Issue #8 (and #4's done-condition) on a machine with two H200s, in one device call:
#   1. the GPU timer tests (graph memo, cold-L2 rotation, lead spin);
#   2. one sampled search (GLM-5 TP8, triton+torch, --max-tactics $MAXT, buckets $SAMPLE) on one
#      GPU, then the same on two (--gpus 0,1), each with an empty Triton cache and a fresh cache
#      database: wall time, time per stage, winners compared (bench/compare_winners.py);
#   3. the same sample as two concurrent one-GPU processes over disjoint buckets, each with its
#      own cache, exported and merged with `autotune cache merge`, compared with the two-GPU run;
#   4. the full search `autotune search --model glm5 --tp 8 --families triton,torch --gpus 0,1`
#      until $FULL_UNTIL s after the start, resuming from ./full.db when it was carried in, then
#      bench/dispatch_check.py on its cache;
#   5. bench/w4a4_h200.py (W4A4 timings).
# PHASES picks and orders them ("pair full" by default; pair = 2 and 3, full = 4, w4a4 = 5); a
# phase starts only while enough of the ~585 s call is left. TESTS=0 skips 1, PAIR_MERGE=0 skips 3.
# ONLY=… narrows the sampled searches to matching problems (`autotune search --only`).
# Run from the repo root with the wheels from ../shared/tools/device-wheels.sh in .whl/.
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
T0=$(date +%s)
MAXT=${MAXT:-32}; SAMPLE=${SAMPLE:-1,16,128,1024,4096}; LO=${LO:-1,16,128}; HI=${HI:-1024,4096}
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -4
  python3 -c "import torch, triton, sqlalchemy; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  nproc; date -u; } 2>&1 | tee "$OUT/env.txt"

if [ "${TESTS:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "timer or graph" 2>&1 | tail -4 | tee "$OUT/pytest.txt"
fi

search() {   # search LABEL DB EXTRA...   (fresh Triton cache; wall time, stage line and JSON kept)
  local label=$1 db=$2; shift 2
  local tc; tc=$(mktemp -d)
  local a b; a=$(date +%s.%N)
  TRITON_CACHE_DIR=$tc timeout "${RUN_TIMEOUT:-200}" python3 -m autotune.cli search --model glm5 --tp 8 --families triton,torch \
      --cache "$db" --compile-workers 16 "$@" > "$W/$label.txt" 2> "$W/$label.err"
  local rc=$?; b=$(date +%s.%N)
  echo "$label: exit $rc, wall $(python3 -c "print(round($b-$a,1))") s ($*)" | tee -a "$OUT/runs.txt"
  grep -E "^(measured|jobs per worker|time per stage|compiled)" "$W/$label.txt" | tee -a "$OUT/runs.txt"
  tail -2 "$W/$label.err"
}

pair() {
  local common=(--max-tactics "$MAXT" --budget-s "${BUDGET_S:-2}"); [ -n "${ONLY:-}" ] && common+=(--only "$ONLY")
  search one "$W/one.db" "${common[@]}" --buckets "$SAMPLE" --gpus 0
  search two "$W/two.db" "${common[@]}" --buckets "$SAMPLE" --gpus 0,1
  python3 bench/compare_winners.py "$W/one.db" "$W/two.db" --json "$OUT/one_vs_two.json" | tail -12 | tee -a "$OUT/runs.txt"
  if [ "${PAIR_MERGE:-1}" = 1 ]; then
    # two independent one-GPU processes (as two hosts would run), then their caches merged
    local a b; a=$(date +%s.%N)
    search lo "$W/lo.db" "${common[@]}" --buckets "$LO" --gpus 0 &
    search hi "$W/hi.db" "${common[@]}" --buckets "$HI" --gpus 1 &
    wait; b=$(date +%s.%N)
    echo "lo+hi concurrently: wall $(python3 -c "print(round($b-$a,1))") s" | tee -a "$OUT/runs.txt"
    python3 -m autotune.cli cache export --cache "$W/lo.db" -o "$W/lo.export" && python3 -m autotune.cli cache export --cache "$W/hi.db" -o "$W/hi.export" \
      && python3 -m autotune.cli cache merge "$W/lo.export" "$W/hi.export" -o "$W/merged.db" 2>&1 | tail -2 | tee -a "$OUT/runs.txt"
    python3 bench/compare_winners.py "$W/merged.db" "$W/two.db" --json "$OUT/merged_vs_two.json" | tail -12 | tee -a "$OUT/runs.txt"
  fi
  tar czf "$OUT/pair.tgz" -C "$W" $(cd "$W" && ls one.db two.db lo.db hi.db merged.db one.txt two.txt 2>/dev/null)
}

full() {
  [ -f full.db ] && python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" full.db "$W/full.db"
  local left=$(( ${FULL_UNTIL:-570} - ($(date +%s) - T0) ))
  RUN_TIMEOUT=$left search full "$W/full.db" --gpus 0,1 --json
  python3 bench/trial_timeline.py "$W/full.db" | tee "$OUT/full_timeline.txt"
  timeout 60 python3 bench/dispatch_check.py "$W/full.db" 2>&1 | tail -30 > "$W/dispatch.txt"; tail -3 "$W/dispatch.txt"
  # through SQLite's backup API: a plain cp of a killed search's database misses its -wal file
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$W/full.db" "$OUT/full.db"
  tar czf "$OUT/full.tgz" -C "$W" full.txt dispatch.txt
}

w4a4() {
  timeout "${W4A4_TIMEOUT:-150}" python3 bench/w4a4_h200.py run --out "$W" 2>&1 | tail -30
  cp "$W/w4a4.json" "$OUT/" 2>/dev/null
}

left() { echo $(( ${BUDGET_END:-585} - ($(date +%s) - T0) )); }
declare -A NEEDS=([pair]=${PAIR_NEEDS:-150} [full]=60 [w4a4]=60)   # seconds a phase needs to start
for phase in ${PHASES:-pair full}; do
  if [ "$(left)" -gt "${NEEDS[$phase]}" ]; then W4A4_TIMEOUT=$(( $(left) - 10 < 150 ? $(left) - 10 : 150 )) "$phase"
  else echo "$phase skipped: $(left) s left" | tee -a "$OUT/runs.txt"; fi
done
# at most 8 files come back: the text results travel as one archive
(cd "$OUT" && tar czf texts.tgz $(ls *.txt *.json 2>/dev/null) && rm -f *.txt *.json)
ls -la "$OUT"
