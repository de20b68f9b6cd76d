"""The W4A16 smem/tmem model against the compiler outside the default space (issue #14).

    python3 -m tools.triton_smem.region_sweep [--jobs 2]

Cross-compiles (LLVM-IR stop, no GPU) the sets below for sm89, sm90, sm100 and sm120 and sorts
each config by `smem.unchecked`: inside the checked region the model must equal the compiler
(exit 1 otherwise); outside, the family's verdict is unknown unless a compiler-figure provider
answers, and the table counts how often the rule would have been right anyway.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time

from autotune.core.arch import get_arch
from autotune.tactics.triton_fp4.smem import smem_bytes, tmem_columns, unchecked
from tools.triton_smem.compiled import shared_of

ARCHS = ("sm89", "sm90", "sm100", "sm120")


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict:
    return dict(kernel="w4a16_dequant", block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
                group_m=1, split_k=1)


def configs() -> dict[str, list[tuple[str, dict, str]]]:
    """name -> [(fmt, params, arch)]: what each set probes."""
    sets = {
        "warps 1/2/16": [("nvfp4", _cfg(bm, bn, bk, w, 3), a) for a, w, (bm, bn, bk) in itertools.product(
            ARCHS, (1, 2, 16), ((16, 32, 64), (64, 64, 128), (128, 128, 128)))],
        "BLOCK_N 16": [("nvfp4", _cfg(bm, 16, bk, 4, s), a) for a, bm, bk, s in itertools.product(
            ARCHS, (16, 64), (64, 128), (2, 4, 6, 8))],
        "BLOCK_M 256": [("nvfp4", _cfg(256, bn, bk, w, s), a) for a, bn, bk, w, s in itertools.product(
            ("sm90", "sm100"), (32, 64, 128), (64, 128), (4, 8), (2, 3))],
        "stages 5/8": [("nvfp4", _cfg(bm, bn, 128, w, s), a) for a, bm, bn, w, s in itertools.product(
            ARCHS, (16, 64, 128), (64, 128), (4, 8), (5, 8))],
        "BLOCK_K 512": [("nvfp4", _cfg(bm, bn, 512, w, 2), a) for a, bm, bn, w in itertools.product(
            ARCHS, (16, 64), (32, 64), (4, 8))],
        "MXFP4 edges": [("mxfp4", _cfg(*c), a) for a, c in itertools.product(ARCHS, (
            (64, 16, 128, 4, 6), (64, 32, 128, 2, 3), (128, 64, 128, 16, 3), (16, 64, 512, 4, 2), (64, 64, 128, 4, 8)))],
        "weight tile < 4 B/thread": [(f, _cfg(bm, 32, 64, 16, s), a) for a, f, bm, s in itertools.product(
            ARCHS, ("nvfp4", "mxfp4"), (16, 64, 128), (2, 5))],
        "warps 1/2/16, more shapes": [(f, _cfg(bm, bn, bk, w, 4), a) for a, f, w, (bm, bn, bk) in itertools.product(
            ARCHS, ("nvfp4", "mxfp4"), (1, 2, 16), ((32, 64, 128), (64, 128, 128), (128, 64, 256)))],
    }
    return sets


def _one(fmt: str, params: dict, arch: str):
    try:
        return shared_of(fmt, params, arch)
    except Exception as e:          # a compile failure is a row of the table
        return f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    from joblib import Parallel, delayed
    sets = configs()
    jobs = [(name, *j) for name, js in sets.items() for j in js]
    t0 = time.time()
    got = Parallel(n_jobs=a.jobs)(delayed(_one)(fmt, c, arch) for _, fmt, c, arch in jobs)
    import triton
    print(f"W4A16 smem/tmem model vs Triton {triton.__version__} outside the default space "
          f"({len(jobs)} cross-compiles to LLVM IR, {time.time() - t0:.0f} s)\n")
    print("| set | configs | in region | in region, model = compiler | outside | outside, rule happened to be right | compile failures |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    bad = 0
    for name in sets:
        rows = [(j, g) for j, g in zip(jobs, got) if j[0] == name]
        n_in = eq_in = n_out = eq_out = fail = 0
        for (_, fmt, c, arch), g in rows:
            if isinstance(g, str):
                fail += 1
                continue
            ar = get_arch(arch)
            same = (smem_bytes(c, fmt, ar), tmem_columns(c, fmt, ar)) == tuple(g)
            if unchecked(c, fmt, ar) is None:
                n_in, eq_in = n_in + 1, eq_in + same
                if not same:
                    bad += 1
                    print(f"  in-region difference: {fmt} {arch} {c} compiled {g}", file=sys.stderr)
            else:
                n_out, eq_out = n_out + 1, eq_out + same
        print(f"| {name} | {len(rows)} | {n_in} | {eq_in} | {n_out} | {eq_out} | {fail} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
