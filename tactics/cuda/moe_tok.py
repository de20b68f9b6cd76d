"""The launcher of the cuda family's token-major grouped-MoE kernel (`kernel="moe_tok"`, moe_tok.cu):
w2's `reduce` variant at decode, one CTA per (token, N tile) summing the token's routed slots in
registers. The kernel needs no scratch (no split-K workspace, no reduce rows, no counters) and no
routing alignment: a call of any M is one launch of grid (M, N / (16 · tiles_n)). Its argument
checks, the bad-id word and the shared slot are moe_mma's (moe.check_call, MoeScratch).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.scratch import stream_key

from . import args as A
from . import layout as L
from . import moe as MOE
from . import moe_search as MOE_SEARCH
from .moe_plan import plannable


class TokLaunch(MOE.MoeLaunch):
    """(x, w, topk_ids, topk_weights=None, out=None, shared_slot=False) → bf16 [M, N] on a checked
    stacked CudaPacked: each token's routing-weighted sum over its top_k slots. `aligned=` is refused
    (the kernel reads topk_ids as they are; aligned_block_m is None at every M)."""

    # no prefetch (w2's kernel: no kernel after it in the layer to prefetch for), no scratch output
    # (its output is the layer's: a fresh tensor)
    caps = replace(MOE.MoeLaunch.caps, prefetches=False, scratch_out=False)

    def __init__(self, problem: Problem, tactic: Tactic, device: str, check_ids: bool | None = None):
        if not MOE.is_tok(tactic):
            raise ValueError(f"TokLaunch runs moe_tok tactics, not {tactic}")
        why = MOE.validate(tactic) or MOE.supports(problem) or MOE.check_tiling(problem, tactic)
        if why:                                     # the kernel holds top_k <= 32 slots and full tiles
            raise ValueError(f"{problem.key} {tactic}: {why}")
        super().__init__(problem, tactic, device, check_ids)

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, shared_slot: bool = False, aligned=None,
                 prefetch=None, scratch_out: bool = False):
        p = self.problem
        if aligned is not None:
            raise ValueError(f"{p.key}: cuda moe_tok reads topk_ids as they are and takes no routing alignment")
        if prefetch is not None or scratch_out:
            raise ValueError(f"{p.key}: cuda moe_tok takes no prefetch and writes no scratch output (w2: the layer's output)")
        fresh = out is None and not self.check_ids
        if fresh:                                       # a form seen before: its plan (moe_plan.py)
            y = self._planned(x, w, topk_ids, topk_weights, shared_slot)
            if y is not None:
                return y
        m, out = self.check(x, w, topk_ids, topk_weights, out, **({"shared_slot": True} if shared_slot else {}))
        if m == 0:
            return out
        self._launch_tok(x, w, topk_ids, topk_weights, out, shared_slot,
                         remember=fresh and plannable(x, topk_ids, topk_weights))
        if self.check_ids:
            MOE.raise_if_bad(self._word(x.device))
        return out

    def _launch_tok(self, x, w, ids, tw, out, shared_slot: bool, remember: bool = False) -> None:
        p, c = self.problem, self.cfg
        m, dev = x.shape[0], x.device
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous().clone() if x.data_ptr() % 16 else x.contiguous()
        ids = ids.contiguous()
        bad = self._word(dev)
        routed = tw is not None
        tw_ = tw.to(torch.float32).contiguous() if routed else bad      # never read unrouted
        gs = w.global_scale
        # the int32 arguments as NumPy scalars made once per call form, pointers as Python ints (moe.py)
        form = (m, ids.dtype == torch.int64, x.dim() == 3, routed, gs.numel() > 1, shared_slot)
        ints = self._ints.get(form)
        if ints is None:
            shared_e, cols = (p.experts - 1, p.top_k - 1) if shared_slot else (-1, p.top_k)
            ints = {k: np.int32(v) for k, v in dict(
                M=m, N=p.n, K=p.k, top_k=p.top_k, n_exp=p.experts, ids64=form[1], x_pair=form[2], routed=form[3],
                gs_stride=form[4], shared_e=shared_e, ids_cols=cols).items()}
            if len(self._ints) < 256:                   # decode serves a few Ms: beyond, made per call
                self._ints[form] = ints
        args = A.MOE_TOK.pack(wq=w.packed.data_ptr(), sq=w.scales.data_ptr(), x=x.data_ptr(), y=out.data_ptr(),
                              gscale=gs.data_ptr(), ids=ids.data_ptr(), tw=tw_.data_ptr(), bad=bad.data_ptr(), **ints)
        grid, block, run, stream = (m, p.n // (L.ROWS * c.tiles_n), 1), (c.threads, 1, 1), self._run(dev), stream_key(dev)
        run(grid, block, args, stream)
        if remember:
            self._remember(x, w, ids, tw, shared_slot, out, grid, block, args, stream, run)


class TokMember(MOE_SEARCH.MoeMember):
    """The token-major grouped kernel (moe_tok.cu) as a member of the cuda family (members.py):
    tactics name kernel="moe_tok"; parameters TOK_SCHEMA; the reduce variant only."""

    def space(self, problem: Problem, arch: Arch) -> list[Tactic]:
        from .moe_search import tok_space
        return tok_space(problem)

    def default(self, problem: Problem, arch: Arch) -> Tactic | None:
        return None                                 # the family's grouped default is moe_mma's

    def runner(self, problem: Problem, tactic: Tactic, device: str) -> Any:
        return TokLaunch(problem, tactic, device)
