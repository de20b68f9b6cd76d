"""Member `moe_w4a16`: grouped MoE (grouped_moe problems). The fused main loop of kernel.py over
stacked experts; rows sorted by expert and padded to BLOCK_M per expert (MoELauncher aligns the
routing on the device, without a host sync)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from autotune.tactics.base import LauncherBase

from .args import fp32_scale, is_interpreting, note_compiled, scales_u8
from .compile import ast_source
from .member import (FAMILY, SHARED_CODE, MIN_BLOCK_K, POW2_K, POW2_MN, STAGES_OK,
                     WARPS_OK, check_axes, grid, scale_consts, w4a16_rules, w4a16_support)
from .smem import smem_bytes, tmem_columns, unchecked
from .w4a16 import default_block_k

KERNEL = "moe_w4a16"
BLOCK_M = (16, 32, 64)
BLOCK_N = (32, 64, 128)
BLOCK_K = (128, 256)
NUM_STAGES = (3, 4)
GRID = {"block_m": BLOCK_M, "block_n": BLOCK_N, "block_k": BLOCK_K, "num_stages": NUM_STAGES, "num_warps": (4,)}
#: the top_k (with routed weights) `sources` compiles for without a problem (cross-compiles for the
#: smem figure): GLM-5's routing; other top_k values compile the same loop and shared memory
COMPILE_TOP_K = 8


def kernel_consts(fmt: str, params: Mapping[str, Any], interp: bool = False) -> dict[str, int]:
    return {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]), "BLOCK_K": int(params["block_k"]),
            **scale_consts(fmt), "DEQ_ASM": 0 if interp else 1, "DOT_F32": 1 if interp else 0}


class MoEMember:
    kernel = KERNEL
    #: this member's sources, keyed into its trials and winners (autotune.core.codekey)
    code = Code.of(f"triton/{KERNEL}", __package__, *SHARED_CODE, ".moe", ".w4a16",
                   ".kernel", ".bound_dense", ".splitk", ".smem", ".direct")
    compat_kernel = KERNEL
    schema = {"kernel": (KERNEL,), "block_m": POW2_MN, "block_n": POW2_MN, "block_k": POW2_K,
              "num_warps": WARPS_OK, "num_stages": STAGES_OK}

    def supports(self, problem: Problem) -> str | None:
        if problem.epilogue != "none":
            return f"triton {KERNEL} has no {problem.epilogue} epilogue (moe_decode has)"
        return w4a16_support(problem, KERNEL, "grouped_moe")

    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> list[Tactic]:
        return [Tactic(FAMILY, kernel=KERNEL, **g) for g in grid(GRID, axes)
                if g["block_k"] >= MIN_BLOCK_K[problem.w_fmt]]

    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        check_axes(KERNEL, GRID, self.schema, axes)

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        return Tactic(FAMILY, kernel=KERNEL, block_m=32, block_n=64, block_k=max(default_block_k(problem), 128),
                      num_warps=4, num_stages=3)

    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        return w4a16_rules(problem, params, arch, pipelined=True)

    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """No split-K: a routed row's K loop is one program's, in one order, whatever the batch."""
        return True

    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return smem_bytes(params, fmt, arch)        # the dense main loop: the same rule

    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return tmem_columns(params, fmt, arch)

    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> str | None:
        # the MoE loop was checked on its own default grid only (docs/triton-smem-table.md)
        for k, vals in GRID.items():
            if params[k] not in vals:
                return f"{k}={params[k]} is outside the grid the moe_w4a16 smem model was checked on ({vals})"
        return unchecked(params, fmt, arch)

    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list[tuple[Any, dict]]:
        from .kernel import MOE_ARG_NAMES, MOE_ARG_TYPES, MOE_DIVISIBLE, moe_w4a16_kernel     # imports Triton
        # TOP_K is a constexpr: the problem's (the search's inputs are routed, x a row per token)
        top_k = COMPILE_TOP_K if problem is None else problem.top_k
        consts = {**kernel_consts(fmt, params), "TOP_K": top_k, "ROUTED_WEIGHT": 1}
        src = ast_source(moe_w4a16_kernel, MOE_ARG_NAMES, MOE_ARG_TYPES, MOE_DIVISIBLE, consts)
        return [(src, {"num_warps": int(params["num_warps"]), "num_stages": int(params["num_stages"])})]

    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> "MoELauncher":
        return MoELauncher(problem, tactic.params)


MEMBER = MoEMember()


class MoELauncher(LauncherBase):
    """kernel(x, w, topk_ids, topk_weights=None, out=None) -> y[M, top_k, N] for a grouped-MoE
    problem: w is an FP4Weight (or the family's U8Weight pack) with packed [E, N, K/2], scales
    [E, N, K/G] and a global scale of shape () or [E]. The routing is aligned on the device without
    a host sync (graph-capturable): pairs sorted by expert (stable), each expert's run padded to
    BLOCK_M, one expert id per row block; the grid is sized by the bound ceil(P/BM) + min(E, P) row
    blocks and blocks past the padded total exit at once."""

    smem_model = None

    def __init__(self, problem: Problem, params: Mapping[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.smem_compiled: int | None = None
        self.compiled = None
        self._consts = kernel_consts(problem.w_fmt, self.params, is_interpreting())

    def align(self, topk_ids):
        """(sorted pair ids padded with P, expert id per row block, padded total) on the device."""
        import torch
        bm, e_count = self.params["block_m"], self.problem.experts
        flat = topk_ids.reshape(-1).to(torch.int64)
        # -1 (expert not on this rank) sorts into a virtual expert E past the real ones: its pairs
        # land beyond `npad`, so their row blocks exit at once and do no work
        flat = torch.where(flat < 0, e_count, flat)
        p = flat.numel()
        dev = flat.device
        counts = torch.zeros(e_count + 1, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + bm - 1) // bm * bm
        ends = torch.cumsum(padded, 0)
        order = torch.argsort(flat, stable=True)
        sorted_e = flat[order]
        rank = torch.arange(p, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
        dest = (ends - padded)[sorted_e] + rank
        blocks = -(-p // bm) + min(e_count + 1, p)
        sorted_ids = torch.full((blocks * bm,), p, dtype=torch.int32, device=dev)
        sorted_ids[dest] = order.to(torch.int32)
        starts = torch.arange(blocks, device=dev, dtype=torch.int64) * bm
        expert_ids = torch.searchsorted(ends, starts, right=True).clamp_(max=e_count - 1).to(torch.int32)
        npad = ends[e_count - 1:e_count].to(torch.int32)     # real experts only
        return sorted_ids, expert_ids, npad, blocks

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None):
        import torch
        import triton

        from .kernel import moe_w4a16_kernel

        prob, p = self.problem, self.params
        if x.dim() == 3:
            # one row per (token, slot): the same kernel over the flattened pairs with top_k = 1
            m, top_k = topk_ids.shape
            if tuple(x.shape) != (m, top_k, prob.k) or top_k != prob.top_k:
                raise ValueError(f"x {tuple(x.shape)} is not [M, top_k={prob.top_k}, K={prob.k}]")
            if out is not None and (tuple(out.shape) != (m, top_k, prob.n) or not out.is_contiguous()):
                raise ValueError(f"out must be a contiguous tensor of shape {(m, top_k, prob.n)}")
            flat = self.__dict__.get("_flat") or MoELauncher(replace(prob, top_k=1), p)
            self._flat = flat
            y = flat(x.reshape(m * top_k, prob.k), w, topk_ids.reshape(-1, 1),
                     None if topk_weights is None else topk_weights.reshape(-1, 1),
                     None if out is None else out.view(m * top_k, 1, prob.n))
            return y.view(m, top_k, prob.n)
        fmt = getattr(w, "fmt", prob.w_fmt)
        if fmt != prob.w_fmt:
            raise ValueError(f"weight format {fmt} does not match the problem's {prob.w_fmt}")
        if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != prob.k:
            raise ValueError(f"x must be a bf16 [M, {prob.k}] tensor, got {tuple(x.shape)} {x.dtype}")
        e_count, n, k = prob.experts, prob.n, prob.k
        if tuple(w.packed.shape) != (e_count, n, k // 2):
            raise ValueError(f"packed weight {tuple(w.packed.shape)} is not [E={e_count}, N={n}, K/2={k // 2}]")
        m, top_k = topk_ids.shape
        if m != x.shape[0] or top_k != prob.top_k:
            raise ValueError(f"topk_ids {tuple(topk_ids.shape)} does not fit x {tuple(x.shape)} and top_k={prob.top_k}")
        if out is None:
            out = torch.empty((m, top_k, n), dtype=torch.bfloat16, device=x.device)
        elif out.shape != (m, top_k, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor of shape {(m, top_k, n)}")
        if m == 0:
            return out
        scales = scales_u8(w)
        gs = fp32_scale(w.global_scale, x.device, e_count)   # one per expert (a scalar is broadcast)
        sorted_ids, expert_ids, npad, blocks = self.align(topk_ids)
        routed = topk_weights is not None
        tw = (topk_weights.to(torch.float32).reshape(-1).contiguous() if routed
              else torch.empty(1, dtype=torch.float32, device=x.device))
        grid = (blocks * triton.cdiv(n, p["block_n"]),)
        ck = moe_w4a16_kernel[grid](x.contiguous(), w.packed.contiguous(), scales, gs, out, sorted_ids, expert_ids,
                                    npad, tw, m * top_k, n, k, TOP_K=top_k, ROUTED_WEIGHT=int(routed),
                                    num_warps=p["num_warps"], num_stages=p["num_stages"], **self._consts)
        note_compiled(self, ck, x.device)
        out.masked_fill_((topk_ids < 0).unsqueeze(-1), 0)     # -1 slots: zero rows (no host sync)
        return out
