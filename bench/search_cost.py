"""Wall time of one search with and without successive halving, of the compile stage with 1 and
2 compile workers, and the count of trials (builds, launches) spent on statically rejected tactics.

    python3 bench/search_cost.py                      # CPU defaults (torch family; Triton cross-compiles for sm90)
    python3 bench/search_cost.py --families triton,torch --buckets 1,16,256,4096 --max-tactics 0   # on a GPU

Each search runs as the real CLI in a fresh process with a fresh cache; prints a markdown table.
Smoke (CI): `--only grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8:reduce --buckets 1 --max-tactics 2
--compile-tactics 1`, one problem whose sm90 space has a single footprint-rejected Triton config: --compile-check's
verdict audit (every footprint-rejected config, up to 200) then compiles 1, where a dense problem's compiles 24
(~70 s of one compile worker on a CPU).
"""
from __future__ import annotations

import json
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import parser  # noqa: E402
from bench.trial_timeline import spent_on_rejected  # noqa: E402


def run(args: list[str]) -> tuple[float, dict]:
    """The CLI in a fresh process with an empty Triton cache, so no run reuses another's compiles."""
    import os
    with tempfile.TemporaryDirectory() as tc:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "autotune.cli", "search", *args, "--json"], cwd=ROOT,
                             capture_output=True, text=True, env={**os.environ, "TRITON_CACHE_DIR": tc})
        wall = time.perf_counter() - t0
    if out.returncode:
        sys.exit(f"search failed ({' '.join(args)}):\n{out.stderr[-3000:]}")
    return wall, json.loads(out.stdout)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", default="8")
    ap.add_argument("--buckets", default="1,2,4")
    ap.add_argument("--families", default="torch")
    ap.add_argument("--compile-arch", default="sm90", help="arch for the compile-stage rows (Triton cross-compiles)")
    ap.add_argument("--compile-tactics", type=int, default=24, help="Triton configs per problem in the compile rows")
    ap.add_argument("--max-tactics", type=int, default=0, help="0: every kept tactic")
    ap.add_argument("--only", default=None, help="only problems matching this (autotune search --only)")
    a = ap.parse_args()
    only = ["--only", a.only] if a.only else []
    base = ["--model", a.model, "--tp", a.tp, "--buckets", a.buckets, "--families", a.families, *only]
    if a.max_tactics:
        base += ["--max-tactics", str(a.max_tactics)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for label, extra in (("exhaustive (--exhaustive)", ["--exhaustive"]), ("successive halving (default)", [])):
            db = Path(d) / f"{len(rows)}.db"
            wall, rep = run(base + ["--cache", str(db)] + extra)
            rejected = sum(f["rejected"] for p in rep["problems"] for f in p["families"])
            rows.append((label, wall, f"{rep['measured']} timed ({rep['dropped']} dropped), {rep['failed']} failed, "
                         f"{len(rep['winners'])} winners", rejected, spent_on_rejected(sqlite3.connect(db))))
        cbase = ["--model", a.model, "--tp", a.tp, "--families", "triton", "--arch", a.compile_arch,
                 "--compile-check", "--max-tactics", str(a.compile_tactics), *only]
        for n in (1, 2):
            wall, rep = run(cbase + ["--compile-workers", str(n)])
            rejected = sum(f["rejected"] for p in rep["problems"] for f in p["families"])
            rows.append((f"compile stage, {n} compile worker{'s' * (n > 1)} ({a.compile_arch})", wall,
                         f"{rep['compiled']} compiled, {len(rep['compile_failures'])} failed, "
                         f"{len(rep['model_errors'])} smem disagreements", rejected,
                         rep["compiled"] - sum(min(f["kept"], a.compile_tactics)
                                               for p in rep["problems"] for f in p["families"])))
    print(f"{platform.node()}, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d')}; `python3 bench/search_cost.py {' '.join(sys.argv[1:])}`\n")
    print("| run | wall s | result | rejected statically | trials/compiles on rejected |")
    print("|---|---:|---|---:|---:|")
    for label, wall, res, rej, spent in rows:
        print(f"| {label} | {wall:.1f} | {res} | {rej} | {spent} |")


if __name__ == "__main__":
    main()
