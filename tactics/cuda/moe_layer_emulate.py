"""The cuda MoE layer kernel (moe_layer.cu) ported to the CPU: its arithmetic through the grouped
kernels' ports (moe_emulate), for the tests' check against float64 (tests/test_cuda_moe_layer.py). Not
imported by the launcher, so not in the member's code key (as moe_emulate is not in moe_mma's)."""
from __future__ import annotations

import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from . import layout as L
from .moe_emulate import emulate as em
from .moe_layer import MAX_PAIRS, check_tiling, w2_problem


def emulate(problem: Problem, tactic: Tactic, x: torch.Tensor, w13: L.CudaPacked, w2: L.CudaPacked,
            topk_ids: torch.Tensor, topk_weights: torch.Tensor | None = None, bad: torch.Tensor | None = None,
            shared_slot: bool = False) -> torch.Tensor:
    """The layer kernel's arithmetic on the CPU: its w13 role is moe_mma's direct route (m_tiles 1,
    split_k 1, the tactic's warps and tiles, SwiGLU) storing h in bf16, its w2 role moe_tok's grid on
    h as x per pair; the roles' order is the protocol's (moe_layer_protocol.py models it)."""
    why = check_tiling(problem, tactic)
    if why:
        raise ValueError(f"{problem.key} {tactic}: {why}")
    wk, st, tn = (int(tactic[k]) for k in ("warps_k", "stages", "tiles_n"))
    m = x.shape[0]
    if m * problem.top_k > MAX_PAIRS:
        raise ValueError(f"{problem.key}: M·top_k = {m * problem.top_k} pairs > {MAX_PAIRS} (the layer kernel's scope)")
    bad = torch.zeros(1, dtype=torch.int32) if bad is None else bad
    w13_t = Tactic("cuda", kernel="moe_mma", warps_k=wk, stages=min(st, 4), tiles_n=tn, m_tiles=1, split_k=1)
    hrows = em(problem, w13_t, x, w13, topk_ids, None, bad=bad, shared_slot=shared_slot)
    w2_t = Tactic("cuda", kernel="moe_tok", warps_k=wk, stages=st, tiles_n=tn)
    return em(w2_problem(problem), w2_t, hrows, w2, topk_ids, topk_weights, bad=bad, shared_slot=shared_slot)
