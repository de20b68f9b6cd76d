"""FP4MoE's weights as its kernels take them: the shared expert's parts, folded in as one more
stacked expert or apart as an FP4MLP, the W4A4 input scales, vLLM's [gate; up] w13 (runtime/moe.py)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from autotune.core.formats import FP4Weight
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.layers import FP4MLP, _fold_up, _per_expert


def _shared_parts(shared) -> tuple:
    """`shared=` as (w13_s, w2_s, up_scale_s or None), or the one-line error."""
    if not isinstance(shared, (tuple, list)) or len(shared) not in (2, 3):
        raise ValueError("shared takes (w13 [2I, H], w2 [H, I]) or (w13, w2, up_scale)")
    return (*shared, None)[:3]


def _shared_mlp(shared: tuple, w13: FP4Weight, dispatcher: Dispatcher, a_fmt: str = "bf16") -> nn.Module:
    """The shared expert apart: an FP4MLP on (w13_s [2I_s, H], w2_s [H, I_s][, up_scale_s]), W4A4
    (a_fmt="nvfp4", its own static input scales) or W4A16."""
    s13, s2, s_up = _shared_parts(shared)
    h = w13.shape[2]
    for name, w in (("w13", s13), ("w2", s2)):
        if not isinstance(w, FP4Weight) or w.fmt != w13.fmt or w.device != w13.device:
            raise ValueError(f"shared {name} must be a {w13.fmt} FP4Weight on {w13.device}, got "
                             f"{getattr(w, 'shape', type(w).__name__)} ({getattr(w, 'fmt', '?')})")
    if s13.packed.ndim != 2 or s13.shape[1] != h:
        raise ValueError(f"shared w13 must be [2I, {h}] (the routed experts' hidden size), got {s13.shape}")
    return FP4MLP(s13, s2, up_scale=s_up, dispatcher=dispatcher, a_fmt=a_fmt)


def _input_scales(w13: FP4Weight, w2: FP4Weight, up_scale: Tensor | None, shared: tuple | None, e: int,
                  a_fmt: str) -> tuple[Tensor | None, Tensor | None]:
    """W4A4: the per-expert static activation scales of w13 and w2 ([E], the shared expert's
    appended). w2's takes the same gate/up factor as its global scale: its input arrives × gate/up
    (see _fold_up), and quantizing c·h under c·s gives h's codes under s."""
    if a_fmt == "bf16":
        return None, None
    if w13.fmt != "nvfp4" or a_fmt != "nvfp4":
        raise ValueError(f"FP4MoE W4A4 is NVFP4 activations on NVFP4 weights, got a_fmt={a_fmt!r} on {w13.fmt}")
    parts = [(w13, w2, up_scale, e)]
    if shared is not None:
        s13, s2, s_up = (*shared, None)[:3]
        parts.append((s13, s2, s_up, None))
    out13, out2 = [], []
    for a, b, up, n in parts:
        if a.input_scale is None or b.input_scale is None:
            raise ValueError("FP4MoE(a_fmt='nvfp4'): W4A4 needs w13 and w2 input_scale (per expert)")
        k = 1 if n is None else n
        i13 = a.input_scale.float().reshape(-1).expand(k) if a.input_scale.numel() == 1 else a.input_scale.float().reshape(k)
        i2 = b.input_scale.float().reshape(-1).expand(k) if b.input_scale.numel() == 1 else b.input_scale.float().reshape(k)
        if up is not None:
            g = a.global_scale.float().reshape(-1).expand(k) if a.global_scale.numel() == 1 else a.global_scale.float().reshape(k)
            u = up.float().reshape(-1).expand(k) if up.numel() == 1 else up.float().reshape(k)
            i2 = i2 * (g.to(i2.device) / u.to(i2.device))
        out13.append(i13)
        out2.append(i2)
    return torch.cat(out13).contiguous(), torch.cat(out2).contiguous()


def _misfit(shared: tuple, w13: FP4Weight) -> str | None:
    """Why the shared expert cannot be stacked onto the routed experts as one more, or None."""
    s13, s2, _ = _shared_parts(shared)
    _, two_i, h = w13.shape
    for name, w, want in (("w13", s13, (two_i, h)), ("w2", s2, (h, two_i // 2))):
        if not isinstance(w, FP4Weight) or w.packed.ndim != 2 or w.shape != want or w.fmt != w13.fmt \
                or w.global_scale.numel() != 1 or w.device != w13.device:
            return (f"shared {name} must be a 2-D {w13.fmt} FP4Weight {list(want)} with one global scale "
                    f"on {w13.device}, got {getattr(w, 'shape', type(w).__name__)} "
                    f"({getattr(w, 'fmt', '?')}, {getattr(w, 'device', '?')})")
    return None


def _foldable(shared: tuple, w13: FP4Weight) -> bool:
    return _misfit(shared, w13) is None


def _fold_shared(w13: FP4Weight, w2: FP4Weight, g2: Tensor, shared: tuple) -> tuple[FP4Weight, FP4Weight, Tensor]:
    """The routed stacks with the shared expert appended as expert E, per-expert global scales [E+1]."""
    s13, s2, s_up = _shared_parts(shared)
    e = w13.shape[0]
    why = _misfit(shared, w13)
    if why:
        raise ValueError(why)
    if s_up is not None and (not isinstance(s_up, Tensor) or s_up.numel() != 1):
        raise ValueError(f"shared up_scale must be one global scale, got {getattr(s_up, 'shape', type(s_up).__name__)}")
    sg2 = _fold_up(s13.global_scale, s2.global_scale, s_up, None).reshape(1)

    def stack(w: FP4Weight, s: FP4Weight, g: Tensor, sg: Tensor) -> FP4Weight:
        return FP4Weight(torch.cat([w.packed, s.packed[None]]), torch.cat([w.scales, s.scales[None]]),
                         torch.cat([_per_expert(g, e).to(sg.device), sg.float().reshape(1)]), w.fmt)
    w2s = stack(w2, s2, g2, sg2)
    return stack(w13, s13, w13.global_scale, s13.global_scale), w2s, w2s.global_scale


def _stack13(gate: FP4Weight, up: FP4Weight) -> FP4Weight:
    """vLLM's w13: [gate; up] rows per expert, carrying the gate's global scale."""
    return FP4Weight(torch.cat([gate.packed, up.packed], -2), torch.cat([gate.scales, up.scales], -2),
                     gate.global_scale, gate.fmt)
