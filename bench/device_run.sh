#!/usr/bin/env bash
# The device driver: what one GPU call runs, the README's main job first, each stage switched by the
# environment. Run from the repository root with the wheels of ../shared/tools/device-wheels.sh in .whl/:
#   OUT=DIR bash bench/device_run.sh                     (the device tool sets OUT)
#   DRY=1 OUT=DIR MODEL=DIR TP=1 EXTRA="--families torch" bash bench/device_run.sh
#       every stage's plumbing on the CPU (the GPU tests collected, not run; the record written to a
#       copy; the searches on the CPU; the step and the host bench in their smoke sizes): CI runs it
#       (tests/test_bench_driver.py); MODEL/TP default to the main job's glm5 / 8
# Stages, in order (each under `cap`: its own limit or what is left of CALL_S, whichever is smaller):
#   GPU_TESTS=1  the GPU tests below; all passed: tools/mark_gpu_checked.py records the cuda kernels'
#                texts as GPU-checked (→ $OUT/gpu_checked.json; commit it with the log, named
#                DATE-CARD-COMMIT-gpu-tests.txt, under docs/data/)
#   KEEP=1       without GPU_TESTS: restores the record an earlier call left on this (still warm)
#                machine; a kernel whose code differs from the record's digest stays `unknown`
#                (tactics/cuda/checked.py), so a changed tree cannot inherit it. KEEP=1 also leaves
#                each cache in $KEEP_DIR for the next call (RESUME_DB=$KEEP_DIR/main-job.db.xz)
#   HOST=1       bench/moe_host.py: the host's part of an eager FP4MoE forward, with its profile
#   WHOLE=1      (the default, unless STEP_DB or COMPARE_DB is set: then 0)
#                `autotune search --model $MODEL --tp $TP` on a fresh cache (every search on fresh Triton
#                and cubin caches: compile time counts), cut with SIGINT at SEARCH_S; then `autotune show` and
#                bench/main_job_summary.py → $OUT/main-job.json (RESUME_DB: continue a cut run's cache)
#   REF=1        the same with --measure-every 1 (every bucket measured in full: the reference the bucket cut is
#                judged against) → $OUT/main-job-ref.json; COMPARE then re-times against it
#   MAX64=1      the same with --max-tokens 64 → $OUT/main-job-64.json
#   PREDICT=1    the same with --strategy predict (checked, replay-checked first choices) → $OUT/predict.json
#   LAYERS=1     the whole-MoE-layer problems (`--moe-layers`, M <= LAYERS_TOKENS, default 16) searched into a
#                copy of the main job's cache (this call's, or LAYERS_DB: an earlier call's; its pair problems'
#                winners stored: only the layer jobs run):
#                the layer kernel against the pair → $OUT/layers-trials.txt, $OUT/layers.db.xz; the step
#                then runs on that cache (FP4MoE's layer route serves where a one-launch winner is stored)
#   COMPARE=1    bench/compare_winners.py --retime: the winners at M <= COMPARE_M (64) against the reference's
#                (REF=1's cache, else COMPARE_REF: a committed .db.xz, default the H200 full search), re-timed
#                interleaved in one worker (COMPARE_DB: the whole run's cache of an earlier call)
#   STEP=1       bench/mlp_step_graph.py per form (STEP_FORMS) and MLP (STEP_MLP) → $OUT/step-FORM-MLP/;
#                FOLD=1 first tunes the folded shared-expert problems into the same cache; STEP_PDL="1 0"
#                runs each with programmatic dependent launch on, then off; STEP_PF=0,1 the w2 prefetch;
#                STEP_UPTO="step runtime" each with one copy's layout chosen up to the step's largest M, then
#                by the runtime's default (the documented engine recipe `Dispatcher(cache, one_copy=True)`);
#                STEP_ROUTING=uniform the uniform routing only (default uniform,skewed); STEP_MS the Ms (1,4,16,64)
#   PACK=1       at the end, everything under $OUT but summary.txt into $OUT/out.tar.xz (one file back)
set -uo pipefail
# the GPU tests GPU_TESTS=1 runs (and DRY=1 collects): the timer's and the worker-memory test, the launchers' and the cuda family's
# the cuda members' own GPU tests come from their registry (tactics/cuda/members.py); the replay check's and
# verify's GPU tests prove the served path under a real CUDA graph
GPU_TEST_FILES="tests/test_gpu.py tests/test_workers_gpu.py tests/test_launcher.py tests/test_bound.py tests/test_moe_block.py $(python3 -m autotune.tactics.cuda.members --gpu-tests) tests/test_nosync_gpu.py tests/test_replay.py tests/test_verify.py"

DRY=${DRY:-0}
MODEL=${MODEL:-glm5} TP=${TP:-8} KEEP_DIR=${KEEP_DIR:-/root/keep}
cap() { local want=$1 left; left=$(( ${CALL_S:-1000000} - SECONDS - ${CALL_MARGIN_S:-25} ))
        (( left < want )) && want=$left; (( want < 1 )) && want=1; echo "$want"; }
has_time() { (( ${CALL_S:-1000000} - SECONDS - ${CALL_MARGIN_S:-25} >= ${1:-30} )); }
if [ "$DRY" = 1 ]; then           # the tree's own code, this machine's packages, no GPU
  export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES="" BENCH_SMOKE=1 MLP_GRAPH_SMOKE=1
  DEV=cpu RECORD=$(mktemp -d)/gpu_checked.json
  cp tactics/cuda/gpu_checked.json "$RECORD"      # the tree's record is never written by a dry run
else
  S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
  DEV=cuda RECORD=tactics/cuda/gpu_checked.json
fi
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$(mktemp -d) AUTOTUNE_CUDA_CUBINS=$(mktemp -d)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
# the device record (bench/harness.py: card, driver, versions, commit, date)
python3 -c "import json, sys; from bench.harness import record; json.dump(record(sys.argv[1]), sys.stdout, indent=1)" \
    "$DEV" > "$OUT/env.json" && cat "$OUT/env.json" > "$OUT/env.txt" || { echo "device record failed"; exit 1; }

if [ "${KEEP:-0}" = 1 ] && [ "${GPU_TESTS:-0}" != 1 ] && [ -e "$KEEP_DIR/gpu_checked.json" ]; then
  python3 -c "import pathlib, sys; from autotune.tactics.cuda import checked; checked.record(pathlib.Path(sys.argv[1]))" "$KEEP_DIR/gpu_checked.json" \
      && cp "$KEEP_DIR/gpu_checked.json" "$RECORD" \
      && echo "GPU-check record restored from an earlier call on this machine" | tee -a "$OUT/summary.txt"
fi

if [ "${GPU_TESTS:-0}" = 1 ]; then
  # DRY: the list collected (every file and marker resolves), not run
  sel=$([ "$DRY" = 1 ] && echo --collect-only || echo -rA)
  timeout "$(cap "${GPU_TESTS_S:-480}")" python3 -m pytest -q $sel -p no:cacheprovider -m "gpu or requires_sm90" \
      $GPU_TEST_FILES 2>&1 | tee "$OUT/gpu-tests-full.txt" | tail -5 | tee "$OUT/gpu-tests.txt"
  # the hand-off: every test passed, none skipped, each kernel's own tests PASSED → the record names the
  # kernels' code; the log's name says date, card and commit (the tool may lend an H100 for an H200 call)
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo tree)
  gpu=$(python3 -c "import json; print(json.load(open('$OUT/env.json'))['card'])" | grep -o -i 'h[0-9]\{3\}\|cpu' | head -1 | tr A-Z a-z)
  if python3 tools/mark_gpu_checked.py "$OUT/gpu-tests-full.txt" --record "$RECORD" \
      --log-name "$(date -u +%F)-${gpu:-gpu}-$rev-gpu-tests.txt" 2>&1 | tee -a "$OUT/summary.txt"; then
    cp "$RECORD" "$OUT/gpu_checked.json"
    if [ "${KEEP:-0}" = 1 ]; then mkdir -p "$KEEP_DIR" && cp "$RECORD" "$KEEP_DIR/"; fi
  else
    echo "GPU-check hand-off: nothing recorded" | tee -a "$OUT/summary.txt"
  fi
fi

if [ "${HOST:-0}" = 1 ]; then     # the host's part of an eager FP4MoE forward on this machine, with its cProfile
  small=$([ "$DRY" = 1 ] && echo "--experts 8 --reps 2 --batch 4 --profile 3" || echo "--experts 32 --profile 25")
  timeout "$(cap "${HOST_S:-120}")" python3 bench/moe_host.py --device "$DEV" $small \
      --json "$OUT/moe-host.json" 2>&1 | tail -45 | tee "$OUT/moe-host.txt"
fi

run() {   # run NAME SECONDS [extra flags]: one search on a fresh cache, then show and the summary
  local name=$1 secs=$2; shift 2
  local db=$W/$name.db cmd="autotune search --model $MODEL --tp $TP $*"
  local t0 t1 rc
  if [ -n "${RESUME_DB:-}" ] && [ "$name" = main-job ]; then     # the whole run only
    case $RESUME_DB in *.xz) xz -dc "$RESUME_DB" > "$db";; *) cp "$RESUME_DB" "$db";; esac
    cmd="$cmd (resumed)"
  fi
  t0=$(date +%s.%N)
  secs=$(cap "$secs")
  # empty Triton and cubin caches per search: an earlier stage's compiles would shorten its compile wait
  TRITON_CACHE_DIR=$(mktemp -d) AUTOTUNE_CUDA_CUBINS=$(mktemp -d) timeout -s INT -k 30 "$secs" python3 -m autotune.cli search --model "$MODEL" --tp "$TP" "$@" --cache "$db" --json \
      > "$W/$name.json" 2> "$W/$name.err"
  rc=$?; t1=$(date +%s.%N)
  local wall; wall=$(python3 -c "print(round($t1 - $t0, 1))")
  echo "$name: search exit $rc, wall $wall s" | tee -a "$OUT/summary.txt"
  grep -v '^progress:' "$W/$name.err" | tail -5
  tail -2 "$W/$name.err" | tee -a "$OUT/summary.txt"
  python3 -m autotune.cli show --model "$MODEL" --tp "$TP" --cache "$db" > "$OUT/$name-show.txt" 2>&1
  [ -s "$W/$name.json" ] || echo '{}' > "$W/$name.json"
  python3 bench/main_job_summary.py "$db" --search-json "$W/$name.json" --wall-s "$wall" --command "$cmd" \
      --model "$MODEL" --tp "$TP" --device "$DEV" --max-tokens "${MAXT:-8192}" -o "$OUT/$name.json" 2>&1 \
      | tail -1 | tee -a "$OUT/summary.txt"
  xz -T0 -c "$db" > "$OUT/$name.db.xz"
  if [ "${KEEP:-0}" = 1 ]; then mkdir -p "$KEEP_DIR" && cp "$OUT/$name.db.xz" "$KEEP_DIR/"; fi
}

# WHOLE defaults on, but off where STEP_DB, COMPARE_DB or LAYERS_DB names an earlier call's cache (a later call)
if [ "${WHOLE:-$([ -n "${STEP_DB:-}${COMPARE_DB:-}${LAYERS_DB:-}" ] && echo 0 || echo 1)}" = 1 ]; then
  MAXT=${MAXT_WHOLE:-8192} run main-job "${SEARCH_S:-540}" ${EXTRA:-}
fi
if [ "${REF:-0}" = 1 ]; then
  MAXT=${MAXT_WHOLE:-8192} run main-job-ref "${REF_S:-300}" --measure-every 1 ${EXTRA:-}
fi
if [ "${MAX64:-0}" = 1 ]; then
  MAXT=64 run main-job-64 "${SEARCH64_S:-120}" --max-tokens 64 ${EXTRA64:-}
fi
[ "${PREDICT:-0}" = 1 ] && MAXT=${MAXT_WHOLE:-8192} run predict "${PREDICT_S:-120}" --strategy predict ${EXTRA:-}
whole_db() {     # the whole run's cache (.db or .db.xz); without one, the --max-tokens 64 run's
  local src=${1:-$W/main-job.db}
  [ -e "$src" ] || src=$W/main-job-64.db
  case $src in *.xz) xz -dc "$src" > "$W/whole.db"; echo "$W/whole.db";; *) echo "$src";; esac
}
if [ "${LAYERS:-0}" = 1 ]; then    # the layer problems on a copy of the whole run's cache (pairs' winners stored)
  cp "$(whole_db "${LAYERS_DB:-}")" "$W/layers.db"
  t0=$(date +%s.%N)
  timeout -s INT -k 30 "$(cap "${LAYERS_S:-150}")" python3 -m autotune.cli search --model "$MODEL" --tp "$TP" --moe-layers \
      --max-tokens "${LAYERS_TOKENS:-16}" ${EXTRA:-} --cache "$W/layers.db" > "$W/layers.out" 2> "$W/layers.err"
  echo "layers: search exit $?, wall $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" | tee -a "$OUT/summary.txt"
  grep -v '^progress:' "$W/layers.err" | tail -3 | cut -c1-600 | tee -a "$OUT/summary.txt"
  python3 -c "
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for r in c.execute(\"select t.problem_key, t.bucket, t.family, x.params_json, t.status, round(t.median_us, 2), t.replay_checked, \"
                   \"substr(t.reason, 1, 120) from trials t join tactics x on x.id = t.tactic_id where t.problem_key like 'moe_layer%' \"
                   \"and t.status != 'rejected' order by t.problem_key, t.bucket, t.median_us\"):
    print(*r)" "$W/layers.db" > "$OUT/layers-trials.txt"
  xz -T0 -c "$W/layers.db" > "$OUT/layers.db.xz"
fi
if [ "${COMPARE:-0}" = 1 ]; then
  if [ -e "$W/main-job-ref.db" ]; then cp "$W/main-job-ref.db" "$W/full.db"
  else xz -dc "${COMPARE_REF:-docs/data/2026-11-30-h200x2-full-search.db.xz}" > "$W/full.db"; fi
  timeout "$(cap "${COMPARE_S:-120}")" python3 bench/compare_winners.py "$(whole_db "${COMPARE_DB:-}")" "$W/full.db" --retime \
      --device "$DEV" --max-bucket "${COMPARE_M:-64}" --json "$OUT/compare.json" 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
fi
if [ "${STEP:-0}" = 1 ]; then      # the 78-layer MLP step as one CUDA graph, served by these winners
  sdb=$(whole_db "${STEP_DB:-${COMPARE_DB:-}}")
  if [ -z "${STEP_DB:-}${COMPARE_DB:-}" ] && [ -e "$W/layers.db" ]; then sdb=$W/layers.db; fi   # this call's layer search
  if [ "${FOLD:-0}" = 1 ]; then    # the folded shared-expert problems (e257:top9) tuned into the same cache first
    timeout "$(cap "${FOLD_S:-120}")" python3 -m autotune.cli search --model "$MODEL" --tp "$TP" --fold-shared --only e257 \
        --max-tokens 64 --cache "$sdb" $([ "$DRY" = 1 ] && echo --dry-run) 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
  fi
  # one form per process: each builds ~51 GB of layers
  for form in ${STEP_FORMS:-winners triton}; do for mlp in ${STEP_MLP:-fp4mlp linear}; do for pdl in ${STEP_PDL:-1}; do
  for upto in ${STEP_UPTO:-step}; do
    sfx=$([ "${STEP_PDL:-1}" = 1 ] && echo "" || echo "-pdl$pdl")$([ "${STEP_UPTO:-step}" = step ] && echo "" || echo "-$upto")
    if ! has_time 60; then echo "step $form $mlp$sfx: skipped, the call's time (CALL_S) is spent" | tee -a "$OUT/summary.txt"; continue; fi
    AUTOTUNE_PDL=$pdl timeout "$(cap "${STEP_S:-150}")" python3 bench/mlp_step_graph.py --cache "$sdb" \
        --out "$OUT/step-$form-$mlp$sfx" --forms "$form" --mlp "$mlp" --prefetch "${STEP_PF:-0}" --one-copy-upto "$upto" \
        --routing "${STEP_ROUTING:-uniform,skewed}" --ms "${STEP_MS:-1,4,16,64}" 2>&1 \
        | grep -v -i warn | tail -14
  done; done; done; done
fi
if [ "${PACK:-0}" = 1 ]; then      # the device tool returns a bounded number of files: one archive and the summary
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name out.tar.xz -print0 \
      | xargs -0 tar -cJf out.tar.xz && find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name out.tar.xz -exec rm -rf {} +)
fi
ls -la "$OUT"
