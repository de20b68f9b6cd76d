"""What one Triton precompile costs: `TritonFamily.precompile` of a problem's first N kept tactics
of one kernel on a fresh Triton cache, each timed twice (the compile, then the cache hit).

    python3 bench/precompile_cost.py                        # the folded w13 (e257:top9:swiglu), moe_decode, sm90, 4 tactics
    python3 bench/precompile_cost.py --problem 'grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9:reduce' --n 1

Cross-compiles on the CPU (no GPU needed). A compile that precompile misses happens at the first
launch inside the measuring worker instead.
"""
from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402
from bench.harness import parser  # noqa: E402

FOLDED_W13 = "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu"


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--problem", default=FOLDED_W13)
    ap.add_argument("--kernel", default="moe_decode")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--n", type=int, default=4, help="tactics to precompile (the first kept ones)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="precompile-cost-")    # before Triton loads
    import triton

    from autotune.core.arch import get_arch
    from autotune.core.problem import Problem
    from autotune.tactics.triton_fp4 import TritonFamily
    fam, arch, p = TritonFamily(), get_arch(a.arch), Problem.from_key(a.problem)
    ts = [t for t in fam.enumerate(p, arch) if t["kernel"] == a.kernel and fam.verdict(p, t, arch).ok][:a.n]
    if not ts:
        sys.exit(f"precompile_cost: no kept {a.kernel} tactic for {a.problem} on {a.arch}")
    rows = []
    print(f"{a.problem} on {a.arch}, Triton {triton.__version__}, {platform.machine()} ({os.cpu_count()} cores)")
    print("| tactic | compile s | cache hit ms |\n|---|---:|---:|")
    for t in ts:
        t0 = time.perf_counter()
        fam.precompile(p, t, arch)
        t1 = time.perf_counter()
        fam.precompile(p, t, arch)
        t2 = time.perf_counter()
        rows.append({"tactic": t.params, "compile_s": round(t1 - t0, 3), "hit_ms": round(1e3 * (t2 - t1), 2)})
        print(f"| {t.id} {t.get('route', '')} bm{t.get('block_m')} sk{t.get('split_k', 1)} | {t1 - t0:.2f} | "
              f"{1e3 * (t2 - t1):.1f} |")
    if a.json:
        harness.write(a, {"problem": a.problem, "arch": a.arch, "triton": triton.__version__,
                                            "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
