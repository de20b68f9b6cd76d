"""The Triton family's shared-memory model against the compiler over the whole default space.

For each arch (sm89, sm90, sm100, sm120, sm121) and each config the family enumerates for GLM-5's
problems (dense NVFP4 and grouped-MoE NVFP4), kept or rejected for shared memory alike, compare
`smem.smem_bytes` with `metadata.shared` of a cross-compile (LLVM-IR stop, no GPU) and, on sm100,
the tensor-memory columns. Configs rejected for other reasons (K steps, stages) have no figure.

    python3 bench/triton_smem_table.py --jobs 2 > docs/triton-smem-table.md
"""
from __future__ import annotations

import collections
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: tools/ is not installed
from bench import harness  # noqa: E402

from joblib import Parallel, delayed  # noqa: E402

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.arch import get_arch  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402
from autotune.tactics import registry  # noqa: E402
from autotune.tactics.triton_fp4.smem import tmem_columns  # noqa: E402
from tools.triton_smem.compiled import shared_of  # noqa: E402

ARCHS = ("sm89", "sm90", "sm100", "sm120", "sm121")
PROBLEMS = (Problem.dense(3072, 6144), Problem.moe(512, 6144, experts=256, top_k=8))


def _one(fmt: str, tactic_json: str, arch: str) -> tuple[int | None, int | None, str | None]:
    t = Tactic.from_json(tactic_json)
    try:
        shared, cols = shared_of(fmt, t.params, arch)
        return shared, cols if arch == "sm100" else None, None
    except Exception as e:  # a compile failure is a row too
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="configs per (problem, arch); 0 = all")
    ap.add_argument("--archs", default=",".join(ARCHS), help="comma-separated targets")
    a = ap.parse_args()
    fam = registry.get("triton")
    rows = []   # (arch, problem, tactic, model smem, model tmem, verdict ok)
    for arch_name in a.archs.split(","):
        arch = get_arch(arch_name)
        for p in PROBLEMS:
            ts = [t for t in fam.enumerate(p, arch) if t["kernel"] in ("w4a16_dequant", "moe_w4a16")]
            n = 0
            for t in ts:
                v = fam.verdict(p, t, arch)
                if v.smem_bytes is None:
                    continue          # rejected before shared memory (K steps, stages, compat) or unmodelled
                cols = tmem_columns(t.params, p.w_fmt, arch) if arch.cc[0] == 10 else None
                rows.append((arch_name, p, t, v.smem_bytes, cols, v.ok))
                n += 1
                if a.limit and n >= a.limit:
                    break
    t0 = time.perf_counter()
    got = Parallel(n_jobs=a.jobs)(delayed(_one)(p.w_fmt, t.to_json(), arch) for arch, p, t, *_ in rows)
    wall = time.perf_counter() - t0
    import triton
    print("# Triton shared-memory model vs the compiler, whole default space\n")
    print(f"`python3 bench/triton_smem_table.py {' '.join(sys.argv[1:])}` on {platform.machine()} "
          f"({a.jobs} compile processes, {wall:.0f} s), Triton {triton.__version__}, {time.strftime('%Y-%m-%d')}. "
          "Cross-compiled to LLVM IR for each target, no GPU. Every config the family enumerates for "
          "GLM-5's dense NVFP4 (N 3072, K 6144) and grouped-MoE NVFP4 (N 512, K 6144, 256 experts, top-8) "
          "problems whose verdict carries a shared-memory figure — kept, or rejected for exceeding the "
          "arch's opt-in limit — is compared.\n")
    stats = collections.defaultdict(lambda: [0, 0, 0, 0, 0])   # compared, equal, kept, rejected, failed
    bad = []
    for (arch, p, t, m, cols, ok), (shared, tcols, err) in zip(rows, got):
        s = stats[(arch, p.kind)]
        s[0] += 1
        s[2 if ok else 3] += 1
        if err:
            s[4] += 1
            bad.append(f"| {arch} | {p.kind} | {t} | {m} | compile failed: {err} |")
        elif shared == m and (cols is None or tcols == cols):
            s[1] += 1
        else:
            bad.append(f"| {arch} | {p.kind} | {t} | {m} / tmem {cols} | {shared} / tmem {tcols} |")
    print("| arch | kernel | configs compared | model = compiler | kept | rejected (smem > limit) | compile failures |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (arch, kind), (n, eq, k, r, f) in stats.items():
        print(f"| {arch} | {'moe_w4a16' if kind == 'grouped_moe' else 'w4a16_dequant'} | {n} | {eq} | {k} | {r} | {f} |")
    print()
    if bad:
        print("## Differences\n\n| arch | kernel | config | model | compiler |\n|---|---|---|---|---|")
        print("\n".join(bad))
    else:
        print("No differences.")


if __name__ == "__main__":
    main()
