"""Dispatch every dense problem of a model at a few M values from a searched cache on the GPU,
check each output against float64, and say which rung of the ladder answered (the Triton winners
of an H200 search should answer there).

    python3 bench/dispatch_check.py CACHE.db [--model glm5 --tp 8] [--m 1,7,16,100,1000,8192]
    python3 bench/dispatch_check.py CACHE.db --device cpu --m 1,4      # smoke: a CPU-searched cache
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.core import inputs  # noqa: E402
from autotune.runtime.dispatch import Dispatcher  # noqa: E402
from autotune.models import problems_for  # noqa: E402
from bench.common import existing, parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("cache", type=existing, help="a searched cache (SQLite)")
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--m", default="1,7,16,100,1000,8192", help="comma-separated M values")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    d = Dispatcher(a.cache, record_misses=False)
    worst, fams = 0.0, Counter()
    for u in problems_for(a.model, tp=a.tp):
        p = u.problem
        if p.kind != "dense":
            continue
        for m in map(int, a.m.split(",")):
            s = inputs.make_inputs(p, m, a.device, seed=100 + m)[0]
            rung, t = d.tactic_for(p, m)
            y = d((m, p.n, p.k))(s.x, s.w)
            ref = inputs.reference(p, s)
            err = float((y.double() - ref).norm() / ref.norm())
            worst = max(worst, err)
            fams[t.family] += 1
            print(f"{p.key} m={m} {rung} {t.family} rel_err={err:.2e}")
    print("stats", dict(d.stats), "families", dict(fams), "worst rel_err", f"{worst:.2e}")
    return 0 if worst <= inputs.TOLERANCE["bf16"] else 1


if __name__ == "__main__":
    sys.exit(main())
