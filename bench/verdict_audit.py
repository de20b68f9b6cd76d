"""The verdict audit of `autotune search --compile-check`, over a space wide enough to hold ≥ 200
footprint-rejected Triton tactics per arch (the default space holds 27 on sm90 and sm100, 70 on
sm120, over GLM-5 TP8's problems).

For each arch: plan a widened w4a16_dequant space (moe_w4a16 keeps its default grid: its model was
checked on that grid only, so a wider one is unknown, not rejected) over a model's problems, cross-compile
every kept tactic (or a --max-tactics sample) and a seeded sample of the tactics the static model
rejects for their shared memory, and count kept ones over the limit and rejected ones that fit
(lost). No GPU needed: Triton compiles for any target here (ptxas included).

    nice -n 10 python3 bench/verdict_audit.py --archs sm90,sm100,sm120 --json /tmp/audit.json
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402

from autotune.core.arch import get_arch  # noqa: E402
from autotune.core.buckets import Buckets  # noqa: E402
from autotune.engine.search import search  # noqa: E402
from autotune.engine.workers import Runner  # noqa: E402
from autotune.models import problems_for  # noqa: E402
from autotune.cache import Store  # noqa: E402
from autotune.tactics import registry  # noqa: E402
from autotune.tactics.triton_fp4.family import TritonFamily  # noqa: E402

#: inside the region the smem model was checked on (smem.REGION), so each verdict is a claim
WIDE = {"block_m": (16, 32, 64, 128), "block_k": (64, 128, 256, 512), "num_stages": (2, 3, 4, 5, 6, 7, 8)}


class WideTriton(TritonFamily):
    space_axes = {"w4a16_dequant": WIDE}


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--archs", default="sm90,sm100,sm120")
    ap.add_argument("--sample", type=int, default=200, help="footprint-rejected tactics compiled per arch")
    ap.add_argument("--max-tactics", type=int, default=20, help="kept tactics compiled per problem (evenly spaced)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    registry.register("triton", f"{__name__}:WideTriton")
    fam = registry.get("triton")
    problems = [u.problem for u in problems_for(a.model, tp=a.tp)]
    out = {}
    for arch in a.archs.split(","):
        t0 = time.perf_counter()
        with Store("sqlite://") as store:
            rep = search(problems, families=[fam], store=store, buckets=Buckets.of((1,)), arch=get_arch(arch),
                         dry_run=True, compile_check=True, audit_rejected=a.sample, max_tactics=a.max_tactics,
                         seed=a.seed, runner=Runner(compile_workers=1), log=lambda s: print(s, flush=True))
        for line in rep.audit.lines():
            print(line, flush=True)
        print(f"  ({arch}: {rep.compiled} kept compiled, {len(rep.model_errors)} smem disagreements, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
        out[arch] = {**asdict(rep.audit), "model_errors": rep.model_errors, "kept_compile_failures": rep.compile_failures}
    if a.json:
        harness.write(a, {"model": a.model, "tp": a.tp, "axes": {k: list(v) for k, v in WIDE.items()},
                                            "triton": os.popen(f"{sys.executable} -c 'import triton;print(triton.__version__)'").read().strip(),
                                            "archs": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
