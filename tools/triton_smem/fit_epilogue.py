"""Re-derive smem.SM8X_FULL_TILE_EPILOGUE by cross-compiling Triton for sm89 (no GPU).

    python3 -m tools.triton_smem.fit_epilogue [ARCH]      # exit 1 when the set differs from the model's
"""
from __future__ import annotations

import itertools
import sys

from autotune.tactics.triton_fp4.smem import EPILOGUE_FITTED, SM8X_FULL_TILE_EPILOGUE, mma_pipeline
from tools.triton_smem.compiled import shared_of


def fit_epilogue(arch: str = "sm89", jobs: int = 2) -> set[tuple[int, int, int]]:
    """Cross-compile every (BM, BN, warps) of the fitted domain at its smallest pipeline (NVFP4,
    BK = 64, 2 stages); where the compiler allocates more than the pipeline rule, the epilogue set
    the total — and that excess must be the whole tile, or the model's form is wrong (raises)."""
    from joblib import Parallel, delayed
    cfgs = [dict(block_m=bm, block_n=bn, block_k=64, group_m=1, num_warps=w, num_stages=2, split_k=1,
                 kernel="w4a16_dequant")
            for bm, bn, w in itertools.product(*EPILOGUE_FITTED.values())]
    shared = Parallel(n_jobs=jobs)(delayed(shared_of)("nvfp4", c, arch) for c in cfgs)
    full = set()
    for c, (got, _) in zip(cfgs, shared):
        pipe = mma_pipeline(c, "nvfp4")
        if got > pipe:
            if got != c["block_m"] * c["block_n"] * 2:
                raise AssertionError(f"{c}: compiler {got} is neither the pipeline {pipe} nor the whole tile")
            full.add((c["block_m"], c["block_n"], c["num_warps"]))
    return full


def main(argv: list[str]) -> int:
    found = fit_epilogue(argv[0] if argv else "sm89")
    print("full-tile epilogues:", sorted(found), "(model:", sorted(SM8X_FULL_TILE_EPILOGUE), ")")
    return 0 if found == SM8X_FULL_TILE_EPILOGUE else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
