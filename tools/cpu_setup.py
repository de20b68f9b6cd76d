"""The measuring worker's setup on the CPU, one GLM-5 TP8 routed-expert problem over the main job's
buckets: the weight draw (once a problem) and each bucket's inputs and float64 reference.

    PYTHONPATH=<tree> python tools/cpu_setup.py [--problem KEY]

Runs `Bench.setup` of whichever tree is first on PYTHONPATH, so two trees (a base exported with
`git archive` and the working tree) compare in one sitting; the parts print where the tree's setup
reports them. A figure for docs/measurements, not a test: the CPU is shared and its load
decides the seconds.
"""
from __future__ import annotations

import argparse
import time

KEY = "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=KEY)
    ap.add_argument("--buckets", default="1,2,4,8,16")
    a = ap.parse_args()
    from autotune.engine.worker import Bench
    b = Bench("cpu")
    total = 0.0
    for m in (int(x) for x in a.buckets.split(",")):
        t0 = time.perf_counter()
        out = b.setup(a.problem, m, 0)
        dt = time.perf_counter() - t0
        total += dt
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in (out.get("parts") or {}).items())
        print(f"M={m:<3} setup {dt:6.2f} s" + (f" ({parts})" if parts else ""), flush=True)
    print(f"total {total:.2f} s")


if __name__ == "__main__":
    main()
