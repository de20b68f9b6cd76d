#!/usr/bin/env bash
# The vertical slice on a real GPU, in one device call (see docs/h200-slice.md for the results):
#   1. the GPU-marked tests (kernels at GLM-5 shapes against float64, the CUDA timer);
#   2. `autotune search --model glm5 --tp 8 --families triton,torch` on a bucket sample with a
#      tactic budget (serial compilation: the full space waits for issue #3's compile pool);
#   3. `autotune show` of what it stored, and dispatch of every dense winner checked again.
# Run from the repo root with the wheels from ../shared/tools/device-wheels.sh in .whl/.
set -uo pipefail
S=$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl && export PYTHONPATH=$S:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, sqlalchemy; print('torch', torch.__version__, 'triton', triton.__version__, 'sqlalchemy', sqlalchemy.__version__)" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"

timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_formats.py -k "gpu or cuda or GPU or triton or timer" 2>&1 | tail -15 | tee "$OUT/pytest.txt"

export AUTOTUNE_CACHE=$OUT/h200.db
BUCKETS=${BUCKETS:-1,16,128,1024,8192}
MAXT=${MAXT:-16}
/usr/bin/time -v -o "$OUT/search.time" timeout ${SEARCH_TIMEOUT:-330} python3 -m autotune.cli search --model glm5 --tp 8 \
    --families triton,torch --buckets "$BUCKETS" --max-tactics "$MAXT" > "$OUT/search.txt" 2> "$OUT/search.err"
echo "search exit $?"; grep -E "Elapsed|Maximum resident" "$OUT/search.time"
tail -5 "$OUT/search.txt"; tail -5 "$OUT/search.err"
python3 -m autotune.cli show --model glm5 --tp 8 > "$OUT/show.txt" 2>&1; cat "$OUT/show.txt" | head -60
python3 - <<'PY' | tee "$OUT/dispatch.txt"
import torch
from autotune.core import inputs
from autotune.runtime.dispatch import Dispatcher
from autotune.models import problems_for
d = Dispatcher(record_misses=False)
for u in problems_for("glm5", tp=8):
    p = u.problem
    if p.kind != "dense":
        continue
    for m in (1, 7, 16, 100, 1000):
        s = inputs.make_inputs(p, m, "cuda", seed=100 + m)[0]
        rung, t = d.tactic_for(p, m)
        y = d((m, p.n, p.k))(s.x, s.w)
        ref = inputs.reference(p, s)
        print(f"{p.key} m={m} {rung} {t} rel_err={float((y.double()-ref).norm()/ref.norm()):.2e}")
print("stats", dict(d.stats))
PY
