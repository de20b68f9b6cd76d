"""The W4A4 member's smem/tmem model against the compiler over its whole default space.

    python3 -m tools.triton_smem.w4a4_sweep [--targets 89,90,100,120,121] [--processes N]

prints the model-vs-compiler table (markdown) and exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import sys
import time

from autotune.core.arch import arch_for_cc
from autotune.core.problem import Problem
from autotune.tactics.triton_fp4.smem_w4a4 import smem_bytes, tmem_columns
from autotune.tactics.triton_fp4.w4a4 import MEMBER
from tools.triton_smem.compiled import shared_of


def sweep_one(args):
    """(fmt, cc, params, (shared, tmem) compiled, (shared, tmem) modelled, error) of one config."""
    fmt, cc, params, cache_dir = args
    arch = arch_for_cc(cc // 10, cc % 10)
    try:
        got = shared_of(fmt, params, cc, cache_dir=cache_dir)
    except Exception as e:          # a compile failure is a row of the table, not a crash
        return fmt, cc, params, None, None, f"{type(e).__name__}: {str(e).splitlines()[-1][:160]}"
    want = (smem_bytes(params, fmt, arch), tmem_columns(params, fmt, arch))
    return fmt, cc, params, got, want, None


def sweep(targets=(89, 90, 100, 120, 121), fmts=("nvfp4", "mxfp4"), processes: int = 1) -> list[tuple]:
    """Cross-compile the whole default space for each (format, target): one row per config."""
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    cache = tempfile.mkdtemp(prefix="w4a4-sweep-")
    jobs = [(fmt, cc, t.params, cache) for fmt in fmts for cc in targets
            for t in MEMBER.space(Problem.dense(4096, 4096, fmt, a_fmt=fmt), arch_for_cc(cc // 10, cc % 10))]
    if processes <= 1:
        return [sweep_one(j) for j in jobs]
    import multiprocessing as mp
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(sweep_one, jobs, chunksize=8))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", default="89,90,100,120,121")
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--processes", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.time()
    rows = sweep(tuple(int(c) for c in a.targets.split(",")), tuple(a.formats.split(",")), a.processes)
    import triton
    print(f"W4A4 smem/tmem model vs Triton {triton.__version__} (cross-compiled to LLVM IR, "
          f"{len(rows)} compiles, {time.time() - t0:.0f} s)\n")
    print("| format | target | configs | failed to compile | smem differences | tmem differences |")
    print("|---|---|---:|---:|---:|---:|")
    bad = 0
    for fmt in a.formats.split(","):
        for cc in a.targets.split(","):
            rs = [r for r in rows if r[0] == fmt and r[1] == int(cc)]
            err = [r for r in rs if r[5]]
            ds = [r for r in rs if not r[5] and r[3][0] != r[4][0]]
            dt = [r for r in rs if not r[5] and r[3][1] != r[4][1]]
            bad += len(ds) + len(dt)
            print(f"| {fmt} | sm{cc} | {len(rs)} | {len(err)} | {len(ds)} | {len(dt)} |")
    for r in rows:
        if r[5] or r[3] != r[4]:
            print("  ", r[0], f"sm{r[1]}", r[2], "compiled", r[3], "model", r[4], r[5] or "", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
