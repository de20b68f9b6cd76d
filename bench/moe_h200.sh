#!/bin/bash
# Issue #15 on the H200 in one device call: the routed-MoE search with the fused variants (resumed
# from docs/data/moe-search-h200.db when that exists), then bench/moe_mlp_step_h200.py on its winners.
#   SEARCH_S=360 BENCH_S=170 bash bench/moe_h200.sh        (writes $OUT/moe-search-h200.db, logs, JSON)
# --fold-shared adds the shared-expert-folded problems (e257:top9): resumed from the committed cache,
# only those are new. STRATEGY=ranked measures fewer tactics per job (docs/search.md).
set -u
export PYTHONUNBUFFERED=1
DB=$OUT/work.db
[ -f docs/data/moe-search-h200.db ] && cp docs/data/moe-search-h200.db "$DB"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
timeout "${SEARCH_S:-360}" python3 -m autotune.cli search --model glm5 --tp 8 --only grouped_moe --max-tokens 1024 \
    --fused-moe --fold-shared ${STRATEGY:+--strategy "$STRATEGY"} --cache "$DB" --compile-workers 16 \
    > "$OUT/search.log" 2>&1
rc=$?
echo "search exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/search.log"
tail -25 "$OUT/search.log"
# a consistent copy (the -wal file included): SQLite's backup API, never cp
python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" \
    "$DB" "$OUT/moe-search-h200.db"
if [ $rc -eq 0 ]; then
    timeout "${BENCH_S:-170}" python3 bench/moe_mlp_step_h200.py --moe-cache "$OUT/moe-search-h200.db" \
        --dense-cache docs/data/h200x2-glm5-tp8-full.db.xz --out "$OUT" > "$OUT/bench.log" 2>&1
    echo "bench exit $?"
    tail -30 "$OUT/bench.log"
fi
rm -f "$DB" "$DB-wal" "$DB-shm"
