#!/usr/bin/env bash
# The README's main job as a GPU check (issue #28), in one device call on the H200:
#   0. (GPU_TESTS=1) the worker-memory GPU test (several buckets of a real MoE problem in one worker),
#      the launchers' GPU tests and the cuda family's (dense, moe_mma incl. its shared slot, moe_tok, PDL,
#      no sync); all passed: tools/mark_gpu_checked.py records the kernels' texts (→ $OUT/gpu_checked.json);
#   0a. (LEAK=1) the failed-capture leak's GPU test and bench/capture_leak_h200.py (part 16);
#   0b. (SWEEP=1) bench/moe_latency_h200.py's probes and config sweep (moe_tok beside moe_mma);
#       (HOST=1) bench/moe_host.py --device cuda with its profile;
#   1. `autotune search --model glm5 --tp 8` on a fresh cache (fresh Triton and cubin caches too:
#      compile time counts), default flags, cut with SIGINT at SEARCH_S seconds (the CLI then still
#      prints what it measured and where the time went);
#   2. `autotune show`, and bench/main_job_summary.py → $OUT/main-job-h200.json (wall time, stages,
#      trials by cause, jobs not measured, winners/jobs, defaults among the served GLM-5 layers,
#      peak worker memory, date, commit, versions);
#   3. (MAX64=1; WHOLE=0 skips step 1) the same with --max-tokens 64 on another fresh cache → $OUT/main-job-h200-64.json;
#   4. (COMPARE=1) bench/compare_winners.py --retime: its winners at M <= 64 against the committed
#      full-search winners, both re-timed interleaved in one worker;
#   5. (STEP=1) bench/mlp_step_graph_h200.py on its winners, one process per form (STEP_FORMS, STEP_MLP:
#      space-separated) → $OUT/step-FORM-MLP/mlp-step-graph.json (issue #26); FOLD=1 first tunes the
#      folded shared-expert problems into the same cache (for STEP_MLP=fold); STEP_PDL="1 0" runs each
#      form with programmatic dependent launch on and off (AUTOTUNE_PDL, issue #26 item 7).
# COMPARE_DB=path (.db or .db.xz) takes the whole run's cache from an earlier call (WHOLE=0).
# The whole search takes ≈ 500 s since run 12: GPU tests in one call, then `WHOLE=1 KEEP=1`, and if
# it was cut, `RESUME_DB=/root/keep/main-job-h200.db.xz` in the next (the machine stays warm 30 s).
# Run from the repo root with the wheels of ../shared/tools/device-wheels.sh (plus platformdirs) in .whl/:
#   OUT=DIR bash bench/h200_main_job.sh            (the device tool sets OUT)
set -uo pipefail
# CALL_S (seconds, optional): the device call's own limit. Each stage below runs under
# `cap SECS`: its own cap, or what is left of CALL_S less a margin for the summaries and the
# copies, whichever is smaller; so a search that ends early leaves its time to the step
# (STEP_S then bounds each form) and nothing starts that the call's limit would kill.
cap() { local want=$1 left; left=$(( ${CALL_S:-1000000} - SECONDS - ${CALL_MARGIN_S:-25} ))
        (( left < want )) && want=$left; (( want < 1 )) && want=1; echo "$want"; }
has_time() { (( ${CALL_S:-1000000} - SECONDS - ${CALL_MARGIN_S:-25} >= ${1:-30} )); }
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$(mktemp -d) AUTOTUNE_CUDA_CUBINS=$(mktemp -d)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton, cupy, sqlalchemy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'sqlalchemy', sqlalchemy.__version__)"
} 2>&1 | tee "$OUT/env.txt"

# KEEP=1 without GPU_TESTS: the GPU-check record an earlier call's tests left on this (still warm) machine,
# restored so its main job measures the kernels just checked with no commit between the calls (the machine
# goes back after 30 s idle). A kernel whose code differs from what the record digests stays `unknown`
# (tactics/cuda/checked.py compares digests), so a changed tree cannot inherit it.
if [ "${KEEP:-0}" = 1 ] && [ "${GPU_TESTS:-0}" != 1 ] && [ -e /root/keep/gpu_checked.json ]; then
  cp /root/keep/gpu_checked.json tactics/cuda/gpu_checked.json && \
      echo "GPU-check record restored from an earlier call on this machine" | tee -a "$OUT/summary.txt"
fi

if [ "${GPU_TESTS:-0}" = 1 ]; then   # the worker-memory test and the GPU tests of the launchers the worker drives
  timeout "${GPU_TESTS_S:-300}" python3 -m pytest -q -rA -p no:cacheprovider -m "gpu or requires_sm90" tests/test_workers_gpu.py \
      tests/test_launcher.py tests/test_bound.py tests/test_moe_block.py $(python3 -m autotune.tactics.cuda.members --gpu-tests) \
      tests/test_nosync_gpu.py 2>&1 | tee "$OUT/gpu-tests-full.txt" | tail -5 | tee "$OUT/gpu-tests.txt"
  # every test passed, none skipped, each kernel's own tests PASSED: record the cuda kernels' code as GPU-checked (tactics/cuda/checked.py), so the
  # main job below measures them; commit $OUT/gpu_checked.json and the log (docs/data/) from this call
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo tree)
  # the log's name says which card ran it (the tool may lend an H100 for an H200 call)
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]\{3\}' | tr A-Z a-z)
  if python3 tools/mark_gpu_checked.py "$OUT/gpu-tests-full.txt" --log-name "gpu-tests-${gpu:-gpu}-$rev.txt" 2>&1 | tee -a "$OUT/summary.txt"; then
    cp tactics/cuda/gpu_checked.json "$OUT/gpu_checked.json"
    if [ "${KEEP:-0}" = 1 ]; then mkdir -p /root/keep && cp tactics/cuda/gpu_checked.json /root/keep/; fi
  fi
fi

# LEAK=1: does a failed CUDA-graph capture keep its memory (docs/moe-decode.md part 16)? The GPU test,
# then bench/capture_leak_h200.py's PyTorch-alone and timer parts (LEAK_JOB=1 adds the main job's case:
# the folded w2 at M = 4096 and 8192 in one worker, ≈ 60 s more) → $OUT/capture-leak.json
if [ "${LEAK:-0}" = 1 ]; then
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_workers_gpu.py -k failed_capture 2>&1 \
      | tail -2 | tee -a "$OUT/summary.txt"
  OUT=$OUT timeout "${LEAK_S:-150}" python3 bench/capture_leak_h200.py $([ "${LEAK_JOB:-0}" = 1 ] || echo --skip-job) \
      2>&1 | grep -v -i warn | tail -6 | tee -a "$OUT/summary.txt"
fi

# AB=1 AB_BASE=DIR: bench/moe_scan_ab_h200.py — this tree's moe_mma against DIR's texts (another
# revision's mma_common.cuh, moe_common.cuh, moe_mma.cu), bits compared, then timed interleaved at
# M = 16 and 64 (the fourteenth session's id-scan change; AB_CACHE: whose winners, default the thirteenth's)
if [ "${AB:-0}" = 1 ]; then
  timeout "${AB_S:-200}" python3 bench/moe_scan_ab_h200.py --baseline "${AB_BASE:?AB_BASE=DIR}" \
      --cache "${AB_CACHE:-docs/data/main-job-h200-thirteenth.db.xz}" --out "$OUT" 2>&1 | grep -v -i warn | tail -20
fi

# SWEEP=1: where the grouped kernels' time goes (bench/moe_latency_h200.py: probes of the served M = 1
# configs, then every kept m_tiles-1 moe_mma config and moe_tok's beside them at M = 1, 4 (and 16 for
# w2:reduce), CUDA-graph replays, cold L2, PDL off) → $OUT/latency/; its timings also as trials of
# $OUT/moe-sweep.db (a rank-model source). With GPU_TESTS=1 WHOLE=0 it fits one call (≈ 200 + 260 s).
if [ "${SWEEP:-0}" = 1 ]; then
  AUTOTUNE_PDL=0 timeout "${SWEEP_S:-300}" python3 bench/moe_latency_h200.py --out "$OUT/latency" \
      --budget-s "${SWEEP_BUDGET:-200}" --store "$OUT/moe-sweep.db" 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
fi
# HOST=1: the host's part of an eager FP4MoE forward on this machine, with its cProfile (issue #26 stage 2)
if [ "${HOST:-0}" = 1 ]; then
  timeout "${HOST_S:-120}" python3 bench/moe_host.py --device cuda --experts 32 --profile 25 \
      --json "$OUT/moe-host.json" 2>&1 | tail -45 | tee "$OUT/moe-host.txt"
fi

run() {   # run NAME SECONDS [extra flags]: one search on a fresh cache, then show and the summary
  local name=$1 secs=$2; shift 2
  local db=$W/$name.db cmd="autotune search --model glm5 --tp 8 $*"
  local t0 t1 rc
  # RESUME_DB (.db or .db.xz; the whole run only): continue a search an earlier call cut (the
  # summary then covers the whole cache, its wall this part's); KEEP=1 leaves the cache in
  # /root/keep/NAME.db, where the next call on the same (still warm) machine finds it
  if [ -n "${RESUME_DB:-}" ] && [ "$name" = main-job-h200 ]; then
    case $RESUME_DB in *.xz) xz -dc "$RESUME_DB" > "$db";; *) cp "$RESUME_DB" "$db";; esac
    cmd="$cmd (resumed)"
  fi
  t0=$(date +%s.%N)
  secs=$(cap "$secs")
  timeout -s INT -k 30 "$secs" python3 -m autotune.cli search --model glm5 --tp 8 "$@" --cache "$db" --json \
      > "$W/$name.json" 2> "$W/$name.err"
  rc=$?; t1=$(date +%s.%N)
  local wall; wall=$(python3 -c "print(round($t1 - $t0, 1))")
  echo "$name: search exit $rc, wall $wall s" | tee -a "$OUT/summary.txt"
  grep -v '^progress:' "$W/$name.err" | tail -5
  tail -2 "$W/$name.err" | tee -a "$OUT/summary.txt"
  python3 -m autotune.cli show --model glm5 --tp 8 --cache "$db" > "$OUT/$name-show.txt" 2>&1
  [ -s "$W/$name.json" ] || echo '{}' > "$W/$name.json"
  python3 bench/main_job_summary.py "$db" --search-json "$W/$name.json" --wall-s "$wall" --command "$cmd" \
      --max-tokens "${MAXT:-8192}" -o "$OUT/$name.json" 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  xz -T0 -c "$db" > "$OUT/$name.db.xz"
  if [ "${KEEP:-0}" = 1 ]; then mkdir -p /root/keep && cp "$OUT/$name.db.xz" /root/keep/; fi
}

if [ "${WHOLE:-1}" = 1 ]; then     # WHOLE=0: only the --max-tokens 64 run (a short device call)
  # ≈ 500 s on one H200 since the folded shared-expert problems joined it (run 12, docs/search.md):
  # with GPU_TESTS=1 it no longer fits one 10-minute device call, so run the tests in a call of their own
  MAXT=8192 run main-job-h200 "${SEARCH_S:-540}" ${EXTRA:-}
fi
if [ "${MAX64:-0}" = 1 ]; then
  MAXT=64 run main-job-h200-64 "${SEARCH64_S:-120}" --max-tokens 64
fi
# COMPARE_DB / STEP_DB: the whole run's cache from an earlier call (.db or .db.xz), when step 1 did not run here
whole_db() {     # the whole run's cache; without one (WHOLE=0, no COMPARE_DB) the --max-tokens 64 run's
  local src=${1:-$W/main-job-h200.db}
  [ -e "$src" ] || src=$W/main-job-h200-64.db
  case $src in *.xz) xz -dc "$src" > "$W/whole.db"; echo "$W/whole.db";; *) echo "$src";; esac
}
if [ "${COMPARE:-0}" = 1 ]; then
  xz -dc docs/data/h200x2-glm5-tp8-full.db.xz > "$W/full.db"
  timeout "${COMPARE_S:-120}" python3 bench/compare_winners.py "$(whole_db "${COMPARE_DB:-}")" "$W/full.db" --retime \
      --max-bucket 64 --json "$OUT/compare.json" 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
fi
if [ "${STEP:-0}" = 1 ]; then      # issue #26: the 78-layer MLP step as one CUDA graph, served by these winners
  sdb=$(whole_db "${STEP_DB:-${COMPARE_DB:-}}")
  if [ "${FOLD:-0}" = 1 ]; then    # item 4: tune the folded shared-expert problems (e257:top9) into the same cache first
    timeout "${FOLD_S:-120}" python3 -m autotune.cli search --model glm5 --tp 8 --fold-shared --only e257 \
        --max-tokens 64 --cache "$sdb" 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
  fi
  # one form per process: each builds ~51 GB of layers
  # STEP_PDL="1 0": each form with programmatic dependent launch on, then off (AUTOTUNE_PDL; item 7)
  # STEP_PF=0,1: each M with w13's L2 prefetch of w2 off, then on (FP4MoE.prefetch_w2; part 15)
  for form in ${STEP_FORMS:-winners triton}; do for mlp in ${STEP_MLP:-fp4mlp linear}; do for pdl in ${STEP_PDL:-1}; do
    sfx=$([ "${STEP_PDL:-1}" = 1 ] && echo "" || echo "-pdl$pdl")
    if ! has_time 60; then echo "step $form $mlp$sfx: skipped, the call's time (CALL_S) is spent" | tee -a "$OUT/summary.txt"; continue; fi
    AUTOTUNE_PDL=$pdl timeout "$(cap "${STEP_S:-150}")" python3 bench/mlp_step_graph_h200.py --cache "$sdb" \
        --out "$OUT/step-$form-$mlp$sfx" --forms "$form" --mlp "$mlp" --prefetch "${STEP_PF:-0}" 2>&1 \
        | grep -v -i warn | tail -14
  done; done; done
fi
# FOLDAB=1: do the folded problems' winners depend on the search's routing draw (random 9 of 257) against
# FP4MoE's served one (8 of 256 + the shared expert last)? bench/fold_routing_ab_h200.py on the whole
# run's cache (STEP_DB / COMPARE_DB, or this call's) → $OUT/fold-routing-ab.json (≈ 150 s)
if [ "${FOLDAB:-0}" = 1 ]; then
  OUT=$OUT timeout "$(cap "${FOLDAB_S:-240}")" python3 bench/fold_routing_ab_h200.py --cache "$(whole_db "${STEP_DB:-${COMPARE_DB:-}}")" \
      2>&1 | grep -v -i warn | tail -12 | tee -a "$OUT/summary.txt"
fi
ls -la "$OUT"
