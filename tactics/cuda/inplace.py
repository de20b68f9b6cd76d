"""The grouped layout written over stacked experts' own bytes (one-copy FP4MoE layers).

`pack_experts_inplace` gives the same bytes as `layout.pack_experts` (a test compares them), over the
weight's packed/scales storage (same byte counts), so a one-copy MoE layer holds no second copy
(GLM-5 TP8's 75 MoE layers in two copies ran an H100 out of memory: docs/fp4moe.md, "One copy of the weights").
It lives apart from layout.py on purpose: layout.py's bit constants are part of what the kernels'
GPU-check record digests (checked.py), and writing the same bytes elsewhere changes no kernel.
"""
from __future__ import annotations

import torch

from autotune.core.formats import HELD_LAYOUT, FP4Weight, refuse_held

from . import layout as L

#: the mark a weight gets when packing its experts in place stopped part-way: neither layout
PARTIAL = f"{L.LAYOUT} (packing in place stopped part-way: neither layout)"


def _checked(w: FP4Weight) -> tuple[int, torch.Tensor]:
    """(E, the fp32 global scales) of stacked experts the grouped layout takes, or a one-line error."""
    if w.fmt not in L.FORMAT or w.packed.ndim != 3:
        raise ValueError(f"cuda grouped layout takes stacked [E, N, K] nvfp4/mxfp4 experts, got {w.fmt} "
                         f"{tuple(w.packed.shape)}")
    e = w.packed.shape[0]
    why = L.check_shape(w.n, w.k)
    if why:
        raise ValueError(f"cuda layout: {why}")
    g = w.global_scale.to(torch.float32).reshape(-1).contiguous()
    if g.numel() not in (1, e):
        raise ValueError(f"cuda layout: {g.numel()} global scales for {e} experts (want 1 or {e})")
    if not (w.packed.is_contiguous() and w.scales.is_contiguous()):
        raise ValueError("cuda layout: packing experts in place needs contiguous packed and scales")
    return e, g


def pack_experts_inplace(w: FP4Weight) -> L.CudaPacked:
    """Expert by expert over w's own bytes: each expert is read whole before it is written; every
    check runs before the first write; should a write still fail part-way, the weight is marked
    PARTIAL, so every checkpoint reader (and another pack) refuses it."""
    refuse_held(w, "cuda layout pack")
    e, g = _checked(w)
    n, k = w.n, w.k
    enc = L.encode_scales if w.fmt == "nvfp4" else L.encode_scales_mx
    raw, sc = w.packed, w.scales.view(torch.uint8)
    try:
        for i in range(e):
            words_i = L._words_of(w.packed[i], n, k)
            sc_i = L._scale_order_fmt(enc(w.scales[i]), n, k, w.fmt)
            raw[i] = words_i
            sc[i] = sc_i
    except BaseException:
        setattr(w.packed, HELD_LAYOUT, PARTIAL)
        raise
    return L.CudaPacked(raw, sc, g, w.fmt, n, k, w.input_scale, experts=e)


def wrap_experts(w: FP4Weight) -> L.CudaPacked:
    """Stacked experts whose storage holds the grouped layout already (packed in place, then moved
    with the layer): no packing; shapes checked, bytes taken as they are."""
    e, g = _checked(w)
    return L.CudaPacked(w.packed, w.scales.view(torch.uint8), g, w.fmt, w.n, w.k, w.input_scale, experts=e)
