"""The grouped-MoE launchers' argument checks (moe_mma and moe_tok: moe.py re-exports them): one-line
ValueErrors for anything a kernel would misread, before it is launched."""
from __future__ import annotations

import torch

from autotune.core.operands import x_per_pair
from autotune.core.problem import Problem
from autotune.tactics.scratch import capturing

from . import build as B
from . import layout as L


def check_alignment(problem: Problem, cfg: B.MoeConfig, m: int, kind: str, rows: int, aligned, device) -> None:
    """A caller's alignment (`aligned=`) must be for this call's pairs, in one aligned launch, at a
    BLOCK_M the groups divide, its int32 buffers on `device` and as large as its block count says
    (the kernel reads sorted_ids[max_blocks · BLOCK_M] and expert_ids[max_blocks] unchecked)."""
    if aligned is None:
        return
    if not all(isinstance(getattr(aligned, a, None), int) for a in ("pairs", "block_m", "max_blocks")):
        raise ValueError(f"{problem.key}: aligned= must be a routing alignment (moe_align's), got {type(aligned).__name__}")
    if kind != "aligned" or m > rows or aligned.pairs != m * problem.top_k or aligned.block_m % (8 * cfg.m_tiles):
        raise ValueError(f"{problem.key}: an alignment of {aligned.pairs} pairs at BLOCK_M={aligned.block_m} does "
                         f"not serve this call ({m} tokens, route {kind}, {rows} tokens per launch)")
    for name, t, n in (("sorted_ids", aligned.sorted_ids, aligned.max_blocks * aligned.block_m),
                       ("expert_ids", aligned.expert_ids, aligned.max_blocks)):
        if (not torch.is_tensor(t) or t.dtype != torch.int32 or t.device != torch.device(device)
                or not t.is_contiguous() or t.numel() < n):
            raise ValueError(f"{problem.key}: the alignment's {name} must be a contiguous int32 tensor of >= {n} "
                             f"values on {device}, got {getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))} on {getattr(t, 'device', '?')}")


def check_call(problem: Problem, x, w, topk_ids, topk_weights, out, cuda: bool = True, shared_slot: bool = False,
               alloc: bool = True):
    """One-line ValueErrors for anything the kernel would misread; returns (M, out). cuda=False
    (the CPU port) skips the device-type check only. shared_slot: topk_ids / topk_weights hold
    top_k - 1 columns (the kernel adds expert E - 1 as every token's last slot). alloc=False: no
    output made where none is given (out None: the caller's scratch_out)."""
    p = problem
    cols = p.top_k - 1 if shared_slot else p.top_k
    if shared_slot and (p.top_k < 2 or p.experts < 2):
        raise ValueError(f"{p.key}: a shared slot needs top_k >= 2 and E >= 2 (the shared expert is E - 1)")
    dims = 3 if x_per_pair(p, x) else 2
    if (not torch.is_tensor(x) or x.dim() != dims or x.dtype != torch.bfloat16 or x.shape[-1] != p.k
            or (dims == 3 and x.shape[1] != p.top_k)):
        want = f"[M, {p.top_k}, {p.k}]" if dims == 3 else f"[M, {p.k}]"
        raise ValueError(f"{p.key}: x must be bf16 {want}, got {getattr(x, 'dtype', type(x))} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if not isinstance(w, L.CudaPacked) or w.experts != p.experts or (w.n, w.k, w.fmt) != (p.n, p.k, p.w_fmt):
        raise ValueError(f"{p.key}: needs the stacked {L.LAYOUT} pack of {p.experts} {p.w_fmt} experts "
                         f"{p.n}x{p.k}, got {type(w).__name__} {getattr(w, 'experts', None)} x "
                         f"{getattr(w, 'n', None)}x{getattr(w, 'k', None)} {getattr(w, 'fmt', None)}")
    if (cuda and x.device.type != "cuda") or w.packed.device != x.device:
        raise ValueError(f"{p.key}: x and the weight must be on one CUDA device, got {x.device} and {w.packed.device}")
    if w.global_scale.numel() not in (1, p.experts) or w.global_scale.dtype != torch.float32:
        raise ValueError(f"{p.key}: global_scale must be fp32 with 1 or {p.experts} values")
    m = x.shape[0]
    if (not torch.is_tensor(topk_ids) or topk_ids.dtype not in (torch.int32, torch.int64)
            or tuple(topk_ids.shape) != (m, cols) or topk_ids.device != x.device):
        raise ValueError(f"{p.key}: topk_ids must be int32/int64 [{m}, {cols}] on {x.device}, got "
                         f"{getattr(topk_ids, 'dtype', None)} {tuple(getattr(topk_ids, 'shape', ()))}")
    if topk_weights is not None and (not torch.is_tensor(topk_weights) or not topk_weights.is_floating_point()
                                     or tuple(topk_weights.shape) != (m, cols)
                                     or topk_weights.device != x.device):
        raise ValueError(f"{p.key}: topk_weights must be a float [{m}, {cols}] tensor on {x.device}")
    shape = (m, p.n) if p.epilogue == "reduce" else (m, p.top_k, p.out_n)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=x.device) if alloc else None
    elif (not torch.is_tensor(out) or tuple(out.shape) != shape or out.dtype != torch.bfloat16
          or not out.is_contiguous() or out.device != x.device):
        raise ValueError(f"{p.key}: out must be a contiguous bf16 {shape} tensor on {x.device}")
    return m, out


def check_prefetch(problem: Problem, pf, x) -> tuple:
    """`prefetch=(a, b)`: the next kernel's two stacked weight tensors (packed codes and scales), each
    [E, ...] of this problem's E experts, contiguous, on x's device, 16-byte aligned with a multiple of
    16 bytes per expert (the bulk prefetch's rule) — what the kernel slices into L2 by expert id.
    Returns (a, b, bytes per expert of a, of b); a one-line ValueError otherwise."""
    p = problem
    if not isinstance(pf, tuple) or len(pf) != 2 or not all(torch.is_tensor(t) for t in pf):
        raise ValueError(f"{p.key}: prefetch must be a tuple of two weight tensors (packed, scales), got "
                         f"{type(pf).__name__}")
    per = []
    for t in pf:
        nbytes = t.numel() * t.element_size()
        if (t.dim() < 1 or t.shape[0] != p.experts or not t.is_contiguous() or t.device != x.device
                or t.data_ptr() % 16 or nbytes % p.experts or (nbytes // p.experts) % 16
                or nbytes // p.experts >= 1 << 31):
            raise ValueError(f"{p.key}: prefetch tensors must be contiguous [{p.experts}, ...] on {x.device}, "
                             f"16-byte aligned, a multiple of 16 bytes (< 2 GiB) per expert; got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
        per.append(nbytes // p.experts)
    return pf[0], pf[1], per[0], per[1]


def check_apart(problem: Problem, x, out) -> None:
    """scratch_out: the pool's output must not overlap x (x taken from an earlier scratch output)."""
    xa, oa = x.data_ptr(), out.data_ptr()
    if xa < oa + out.numel() * out.element_size() and oa < xa + x.numel() * x.element_size():
        raise ValueError(f"{problem.key}: x overlaps the scratch output (scratch_out=True): pass a copy of x")


def raise_if_bad(bad) -> None:
    """One 4-byte read (a host sync), skipped while a CUDA graph is captured; clears the word."""
    if bad is None or capturing(bad.device):
        return
    if int(bad.item()):
        bad.zero_()
        raise ValueError("topk_ids holds expert ids outside [-1, E) (ids >= E or < -1 are refused)")
