"""ptxas resources (registers, static shared memory, spills) of sampled `moe_mma` configs, compiled
by nvcc for sm_90 and sm_120 — this tree's kernel text, and with `--rev REV` that revision's
mma_common.cuh (+ moe_common.cuh where it has one) + moe_mma.cu beside it (built with this tree's -D options: for revisions whose macros
match). CPU only.

    python3 bench/cuda_moe_regs.py [--rev a5b7e0b] [--json out.json]
    python3 bench/cuda_moe_regs.py --tok            # moe_tok's configs the verdicts keep at GLM-5 TP8's w2:reduce
    python3 bench/cuda_moe_regs.py --space --rev 4876e14 [--arch sm_90] [--jobs 2]
                                                    # every build the grouped cuda tactics of the main job's
                                                    # problems compile to; exit 1 on a spill the revision had not

`--space` is the check to run before a kernel edit reaches a GPU: the loader refuses a config that
spills (a local-memory stack), and a sampled scan once missed one the prefetch's loop caused. It compiles each distinct build once (nvcc, `--jobs` at a time).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import harness  # noqa: E402

#: (m_tiles, warps_k, stages, tiles_n, split_k, swiglu, reduce): served decode configs and the corners
CONFIGS = [(1, 4, 4, 1, 4, 0, 0), (2, 4, 4, 2, 1, 1, 0), (2, 4, 2, 2, 1, 0, 1), (1, 1, 2, 1, 8, 0, 1),
           (2, 2, 4, 4, 2, 0, 0), (2, 4, 2, 4, 4, 1, 0)]
ARCHS = ("sm_90", "sm_120")
#: moe_tok (warps_k, stages, tiles_n) at GLM-5 TP8's w2:reduce (K = 256: warps_k <= 2)
TOK_CONFIGS = [(wk, st, tn) for wk in (1, 2) for st in (2, 4, 8) for tn in (1, 2, 4)
               if st * 32 * wk * 36 * tn <= 48 * 1024]      # the verdict's static-array limit


def tok_resources(build) -> dict[str, dict]:
    out = {}
    for wk, st, tn in TOK_CONFIGS:
        c = build.MoeConfig(1, wk, st, tn, 1, "nvfp4", reduce=True, token=True)
        for arch in ARCHS:
            r = build.nvcc_resources(c, arch)
            out[f"moe_tok wk{wk} st{st} tn{tn} {arch}"] = {"registers": r.registers, "smem": r.smem, "spills": r.spills}
    return out


def resources(build, texts: tuple[Path, ...] | None) -> dict[str, dict]:
    """name → ptxas resources of every config on every arch; `texts` (the files of moe_mma's text, in
    order) replace the tree's sources for the compile."""
    saved = build.SOURCES[build.MOE_KERNEL]
    if texts is not None:
        build.SOURCES[build.MOE_KERNEL] = texts
    try:
        out = {}
        for mt, wk, st, tn, sk, sw, red in CONFIGS:
            c = build.MoeConfig(mt, wk, st, tn, sk, "nvfp4", bool(sw), bool(red))
            for arch in ARCHS:
                r = build.nvcc_resources(c, arch)
                out[f"mt{mt} wk{wk} st{st} tn{tn} sk{sk}{' swiglu' if sw else ''}{' reduce' if red else ''} {arch}"] = {
                    "registers": r.registers, "smem": r.smem, "spills": r.spills}
        return out
    finally:
        build.SOURCES[build.MOE_KERNEL] = saved


def space_configs(model: str = "glm5", tp: int = 8, arch_name: str = "sm90") -> dict[str, object]:
    """name → MoeConfig of every distinct build the cuda family's grouped tactics compile to on the
    main job's problems (fused and folded forms too), as the search keeps them (a tactic unknown only
    for want of its GPU-check record counts)."""
    from autotune.core.arch import ARCHS as ALL
    from autotune.models import problems_for
    from autotune.tactics import registry
    from autotune.tactics.cuda import checked as CK
    from autotune.tactics.cuda import moe as M
    arch, fam = ALL[arch_name], registry.get("cuda")
    out: dict[str, object] = {}
    for u in problems_for(model, tp=tp, fused_moe=True, fused_mlp=True, fold_shared=True):
        p = u.problem
        if p.kind != "grouped_moe":
            continue
        for t in fam.enumerate(p, arch):
            v = fam.verdict(p, t, arch)
            if v.ok is True or CK.awaiting_record(v):
                c = M.config(p, t)
                out.setdefault(repr(c), c)      # a frozen dataclass: its repr names every build option
    return dict(sorted(out.items()))


def space_resources(build, configs: dict[str, dict], texts: tuple[Path, ...] | None, jobs: int) -> dict:
    """name + arch → ptxas resources of each nvcc arch's configs (`configs`: arch → name → config),
    compiled `jobs` at a time (joblib threads: nvcc is the work)."""
    from joblib import Parallel, delayed
    saved = build.SOURCES[build.MOE_KERNEL]
    if texts is not None:
        build.SOURCES[build.MOE_KERNEL] = texts
    try:
        keys = [(n, a) for a, cs in configs.items() for n in cs]
        got = Parallel(n_jobs=jobs, prefer="threads")(delayed(build.nvcc_resources)(configs[a][n], a) for n, a in keys)
        return {f"{n} {a}": {"registers": r.registers, "smem": r.smem, "spills": r.spills} for (n, a), r in zip(keys, got)}
    finally:
        build.SOURCES[build.MOE_KERNEL] = saved


def space_verdict(now: dict, old: dict | None) -> tuple[list[str], str]:
    """(builds that spill now and did not at the revision — or spill at all without one, summary line)."""
    spills = lambda r: bool(r["spills"])   # noqa: E731
    bad = [k for k, r in now.items() if spills(r) and (old is None or not spills(old.get(k, {"spills": 0})))]
    line = f"{len(now)} builds, {sum(spills(r) for r in now.values())} spill"
    if old:
        d = [r["registers"] - old[k]["registers"] for k, r in now.items() if k in old]
        line += f"; registers {min(d):+d} to {max(d):+d} against the revision; new spills: {len(bad)}"
    return bad, line


def at_rev(rev: str, d: Path) -> tuple[Path, ...]:
    """moe_mma's text files (build.SOURCES: the shared parts, then its own file) as they were at `rev`,
    written under `d`. A shared part the revision lacks is left out (it predates that part); a revision
    before the package layout keeps them under tactics/cuda/."""
    from autotune.tactics.cuda import build as B
    *shared, own = B.SOURCES[B.MOE_KERNEL]
    paths = []
    for f in (*shared, own):
        for rel in (f.relative_to(ROOT).as_posix(), f"tactics/cuda/{f.name}"):
            r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True)
            if not r.returncode:
                break
        if r.returncode and f is not own:
            continue
        if r.returncode:
            raise SystemExit(f"{rev}: no {f.relative_to(ROOT).as_posix()}")
        (d / f.name).write_bytes(r.stdout)
        paths.append(d / f.name)
    return tuple(paths)


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--rev", help="also compile this revision's kernel text")
    ap.add_argument("--json")
    ap.add_argument("--tok", action="store_true", help="moe_tok's configs instead of moe_mma's")
    ap.add_argument("--space", action="store_true", help="every build of the main job's grouped cuda tactics")
    ap.add_argument("--arch", action="append", help="with --space: nvcc arch(s) (default sm_90)")
    ap.add_argument("--jobs", type=int, default=2, help="with --space: compiles at a time")
    ap.add_argument("--limit", type=int, help="with --space: the first N builds only (a smoke run)")
    a = ap.parse_args(argv)
    from autotune.tactics.cuda import build as B
    if B.nvcc() is None:
        print("nvcc not on PATH", file=sys.stderr)
        return 2
    if a.tok and a.rev:
        print("--tok compiles this tree's moe_tok only (no --rev)", file=sys.stderr)
        return 2
    if a.space:
        archs = tuple(a.arch or ("sm_90",))
        # each arch's own space (sm_120 keeps other configs than sm_90: its shared memory is smaller)
        configs = {arch: dict(list(space_configs(arch_name=arch.replace("_", "")).items())[:a.limit or None])
                   for arch in archs}
        now = space_resources(B, configs, None, a.jobs)
        with tempfile.TemporaryDirectory() as t:
            old = space_resources(B, configs, at_rev(a.rev, Path(t)), a.jobs) if a.rev else None
        bad, line = space_verdict(now, old)
        for k in bad:
            print(f"spills: {k}: {now[k]}" + (f" (at {a.rev}: {old[k]})" if old else ""))
        print(line)
        if a.json:
            harness.write(a, {"rev": a.rev, "archs": archs, "now": now, "rev_resources": old,
                                                "new_spills": bad})
        return 1 if bad else 0
    now = tok_resources(B) if a.tok else resources(B, None)
    with tempfile.TemporaryDirectory() as t:
        old = resources(B, at_rev(a.rev, Path(t))) if a.rev else None
    print("| config | arch |" + (f" registers {a.rev} |" if old else "") + " registers | smem B | spills |")
    print("|---|---|" + ("---:|" if old else "") + "---:|---:|---|")
    for k, v in now.items():
        cfg, arch = k.rsplit(" ", 1)
        was = f" {old[k]['registers']} |" if old else ""
        print(f"| {cfg} | {arch} |{was} {v['registers']} | {v['smem']} | {v['spills']} |")
    if old:
        d = [v["registers"] - old[k]["registers"] for k, v in now.items()]
        print(f"register change: {min(d):+d} to {max(d):+d} over {len(d)} builds; smem equal: "
              f"{all(v['smem'] == old[k]['smem'] for k, v in now.items())}")
    if a.json:
        harness.write(a, {"rev": a.rev, "now": now, "rev_resources": old})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
