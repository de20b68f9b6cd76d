"""The cuda family's grouped-MoE search policy: which tactics exist for a problem, which are worth
timing at an M, the launch figures the rank model reads, and the untuned default.

Kept apart from moe.py (the launchers, whose text the GPU-check record digests: checked.py) so that
a change of search policy — a threshold, a figure, a new point of the space — does not make the
kernels `unknown` until their GPU tests run again. What decides whether a tactic is *correct* to
run (its parameters, tiling and shared memory: moe.validate / check_tiling / verdict) stays in moe.py.
`MoeMember`, moe_mma's member of the cuda family, is here: it joins moe.py's checks and launcher
to this policy (moe.py imports nothing of this module).
"""
from __future__ import annotations

from typing import Any

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict

from . import build as B
from . import layout as L
from . import moe as M
from .moe import (KERNEL, M_TILES, MAX_PAIRS, N_WALK, SPLIT_K, STAGES, TILES_N, TOK_KERNEL, TOK_STAGES, WARPS_K,
                  check_tok, is_tok, n_walk)


def enumerate_space(problem: Problem) -> list[Tactic]:
    """Both grouped members' spaces: moe_mma's, then moe_tok's."""
    return mma_space(problem) + tok_space(problem)


def mma_space(problem: Problem) -> list[Tactic]:
    space = [Tactic("cuda", kernel=KERNEL, warps_k=w, stages=s, tiles_n=n, m_tiles=m, split_k=k)
             for w in WARPS_K for s in STAGES for n in TILES_N for m in M_TILES for k in SPLIT_K]
    if problem.epilogue == "reduce" and WALKS:
        # m_tiles 1: the walk keeps more live than one tile (wk1 tn4: 168 registers against 128), and two
        # row tiles on top spill on both archs (mt2 wk4 st2 tn2 nw2, ptxas 13.0)
        space += [Tactic("cuda", kernel=KERNEL, warps_k=w, stages=s, tiles_n=n, m_tiles=1, split_k=1, n_walk=v)
                  for w in WARPS_K for s in STAGES for n in TILES_N for v in N_WALK if not walk_spills(w, s, n)]
    return space


def tok_space(problem: Problem) -> list[Tactic]:
    if check_tok(problem):
        return []
    return [Tactic("cuda", kernel=TOK_KERNEL, warps_k=w, stages=s, tiles_n=n)
            for w in WARPS_K for s in TOK_STAGES for n in TILES_N]


#: the N-tile walk (n_walk) in the search space: off — on an H100 (2026-12-05, docs/decisions/0006-n-tile-walk-out-of-search.md,
#: docs/data/moe-walk-ab-h100.json) every walk was slower than the same tactic walking one tile where FP4MoE
#: serves w2 (aligned M = 64: 158-205 against 137-142 µs; routed M = 16: 65-85 against 57-58; folded M = 16:
#: 97-124 against 83; only the unserved direct route at M = 64 gained, 185 against 199 at n_walk 4). The kernel
#: keeps the parameter (GPU-tested) for step 3 of the design (the next tile's loads under this one's epilogue).
WALKS = False


def walk_spills(warps_k: int, stages: int, tiles_n: int) -> bool:
    """Walks ptxas 13.0 may spill: every one of the 72 walk configs compiled for nvfp4 and mxfp4, sm_90
    and sm_120 (2026-12-05, the walk's final text: 26 of 288 builds spill, all inside this rule — tiles_n 1
    with 2+ warps on sm_90 at n_walk 2, and from 8 warps at any n_walk, 80 registers and 32-56 B; warps_k
    4 / stages 2 / tiles_n 2 on sm_120, 8-16 B). The rule covers a few that compile clean (safe: fewer
    tactics); the family refuses a spilling kernel at load (a failed trial). tests/test_cuda_moe.py
    recompiles a sample."""
    return (tiles_n == 1 and warps_k >= 2) or (warps_k, stages, tiles_n) == (4, 2, 2)


def default(problem: Problem, arch: Arch) -> Tactic:
    """4 warps (fewer where K has fewer k-pairs), K split so M = 1 still fills the SMs, 2 row tiles
    for SwiGLU (gate + up)."""
    kp = problem.k // L.KPAIR
    wk = max(w for w in WARPS_K if kp % w == 0 and w <= 4)
    sk = max(s for s in SPLIT_K if kp % (wk * s) == 0 and kp // (wk * s) >= 2 or s == 1)
    tn = 2 if problem.epilogue == "swiglu" else 1
    return Tactic("cuda", kernel=KERNEL, warps_k=wk, stages=4, tiles_n=tn, m_tiles=1, split_k=sk)


#: moe_tok re-reads an expert's weight for every token routed to it (moe_mma: once per group of up to
#: 8·m_tiles pairs). L2 catches part of the re-reads: at 2.0 pairs per expert (GLM-5 TP8's routed w2,
#: M = 64) it still beat moe_mma on the H200 (121.4 against 138.9 µs, docs/decisions/0011-moe-tok-up-to-3-pairs-per-expert.md),
#: so the search times it up to 3 (the folded w2's 2.24 at M = 64 included), not past
TOK_PAIRS_PER_EXPERT = 3


def useful(problem: Problem, tactic: Tactic, m: int) -> bool:
    """moe_tok only while M·top_k <= TOK_PAIRS_PER_EXPERT·E (GLM-5 TP8: M <= 96 routed, 85 folded)."""
    return not is_tok(tactic) or m * problem.top_k <= TOK_PAIRS_PER_EXPERT * problem.experts


def figures(problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
    if is_tok(tactic):                 # one CTA per (token, N tile)
        return {"ctas": float(max(m, 1) * problem.n // (L.ROWS * int(tactic["tiles_n"]))),
                "threads": float(32 * int(tactic["warps_k"]))}
    # the direct route's launch size: kept as the shipped rank model was fitted on it (the aligned
    # route, M > 32 at top-8, launches fewer CTAs; a refit with route-aware figures is still to do)
    pairs = min(m * problem.top_k, MAX_PAIRS)
    ctas = pairs * problem.n // (L.ROWS * int(tactic["tiles_n"]) * n_walk(tactic)) * int(tactic["split_k"])
    return {"ctas": float(ctas), "threads": float(32 * int(tactic["warps_k"]))}


class MoeMember:
    """The grouped kernel (moe_mma.cu) as a member of the cuda family (members.py): tactics name
    kernel="moe_mma"; parameters SCHEMA (WALK_SCHEMA with n_walk); one compiled variant per tactic. Its
    parameters, verdict and launcher are moe.py's; its space, default and figures are this module's."""

    grouped = True

    def __init__(self, member: Any):
        self.member = member

    def validate(self, tactic: Tactic) -> str | None:
        return M.validate(tactic)

    def space(self, problem: Problem, arch: Arch) -> list[Tactic]:
        return mma_space(problem)

    def default(self, problem: Problem, arch: Arch) -> Tactic | None:
        return default(problem, arch)

    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        return M.verdict(problem, tactic, arch)

    def configs(self, problem: Problem, tactic: Tactic) -> list:
        return [M.config(problem, tactic)]

    def runner(self, problem: Problem, tactic: Tactic, device: str) -> Any:
        """`run(x, packed, topk_ids, topk_weights=None, out=None)`: CuPy is imported at its first launch."""
        return M.MoeLaunch(problem, tactic, device)

    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        return figures(problem, tactic, m, sms)
