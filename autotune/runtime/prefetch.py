"""FP4MoE's rule for w13's L2 prefetch of w2 (docs/fp4moe.md#prefetching-w2-into-l2; off by default): which M,
which tensors. A launcher that `prefetches` (tactics/base.py) takes the pair of w2's stacked weight
tensors as w2's launcher reads them; the runtime passes it only where both kernels' bytes for the
experts an M can touch fit in a share of the L2, so the prefetched lines are still there for w2."""
from __future__ import annotations

from typing import Any

import torch

#: the share of the L2 the prefetch may fill: w13's and w2's bytes for the experts an M can touch
L2_SHARE = 0.5
_L2: dict[str, int] = {}


def fits(pairs: int, experts: int, bytes_per_expert: int, l2_bytes: int) -> bool:
    """Do both kernels' bytes for the experts `pairs` (token, slot) pairs can touch — at most
    min(pairs, E) — fit in L2_SHARE of the L2? (GLM-5 TP8 folded on an H200: M = 1 only.)"""
    return min(pairs, experts) * bytes_per_expert <= L2_SHARE * l2_bytes


def stacked(t: Any, experts: int) -> bool:
    """A tensor `prefetch=` takes: [E, ...] contiguous, 16-byte aligned, a multiple of 16 bytes per expert."""
    if not torch.is_tensor(t) or t.dim() < 1 or t.shape[0] != experts or not t.is_contiguous() or t.data_ptr() % 16:
        return False
    nbytes = t.numel() * t.element_size()
    return nbytes % experts == 0 and (nbytes // experts) % 16 == 0


def l2_bytes(device: Any) -> int:
    """The device's L2 in bytes (read once per device); 0 off CUDA (no prefetch there)."""
    if getattr(device, "type", None) != "cuda":
        return 0
    key = str(device)
    if key not in _L2:
        _L2[key] = int(torch.cuda.get_device_properties(device).L2_cache_size)
    return _L2[key]


def pair_for(l13: Any, l2: Any, experts: int, pairs: int, l2b: int | None, device: Any) -> tuple | None:
    """(w2's packed, w2's scales) as l2 reads them, or None: a weight that is not a stacked pair of
    such tensors (either kernel's), or more bytes than `fits` allows (`l2b`: None for the device's)."""
    spans = [(getattr(w, "packed", None), getattr(w, "scales", None))
             for w in (getattr(l13, "weight", None), getattr(l2, "weight", None))]
    if not all(stacked(t, experts) for ab in spans for t in ab):
        return None
    per = sum(t.numel() * t.element_size() for ab in spans for t in ab) // experts
    return spans[1] if fits(pairs, experts, per, l2_bytes(device) if l2b is None else l2b) else None
