"""FP4MoE's weights as its kernels take them (runtime/moe.py): `MoEWeights.of` checks them, folds
the up/gate scale ratio into w2 and the shared expert in as one more stacked expert (or keeps it
apart for an FP4MLP), gives the W4A4 input scales, and lays every tensor out as the module's
buffers (`BufferLayout`); the two grouped problems they serve; the expert_map's check; vLLM's
[gate; up] w13 (`_stack13`)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from autotune.core.formats import FP4Weight
from autotune.core.problem import Problem
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


def check_expert_map(expert_map: Tensor, local: int) -> None:
    """An expert_map [E_global] (held beside the weights, checked again on every load): each of the
    `local` experts from exactly one global id, every other id -1; else the one-line ValueError."""
    if expert_map.ndim != 1 or expert_map.dtype.is_floating_point or expert_map.dtype == torch.bool:
        raise ValueError(f"expert_map must be a 1-D integer tensor [E_global], got {expert_map.dtype} "
                         f"{tuple(expert_map.shape)}")
    m = expert_map.cpu()
    live = m[m >= 0]
    if int((m < -1).sum()) or live.numel() != local or not torch.equal(live.sort().values, torch.arange(local)):
        raise ValueError(f"expert_map must map each of this rank's {local} experts from exactly one global "
                         "id and every other id to -1")


def _stack13(gate: FP4Weight, up: FP4Weight) -> FP4Weight:
    """vLLM's w13: [gate; up] rows per expert, carrying the gate's global scale."""
    return FP4Weight(torch.cat([gate.packed, up.packed], -2), torch.cat([gate.scales, up.scales], -2),
                     gate.global_scale, gate.fmt)


@dataclass(frozen=True)
class BufferLayout:
    """How FP4MoE holds w13 and w2: every tensor as uint8 bytes (`<name>_packed`, `<name>_scales_u8`,
    `<name>_gs_u8`, `<name>_is`), so `model.to(torch.bfloat16)` casts neither the fp8 block scales
    nor the fp32 global scales (as FP4Linear keeps them); `weight` reads one back as an FP4Weight."""

    fmt: str
    scale_dtype: torch.dtype
    #: each weight's global-scale shape ("w13", "w2")
    gs_shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @staticmethod
    def buffers(name: str, w: FP4Weight, g: Tensor) -> dict[str, Tensor]:
        """`w`'s packed bytes and scales with global scale `g` as `name`'s buffers."""
        return {f"{name}_packed": w.packed, f"{name}_scales_u8": w.scales.contiguous().view(torch.uint8),
                f"{name}_gs_u8": g.float().reshape(-1).contiguous().view(torch.uint8)}

    def weight(self, module: nn.Module, name: str) -> FP4Weight:
        gs = getattr(module, f"{name}_gs_u8").view(torch.float32).reshape(dict(self.gs_shapes)[name])
        return FP4Weight(getattr(module, f"{name}_packed"), getattr(module, f"{name}_scales_u8").view(self.scale_dtype),
                         gs, self.fmt, getattr(module, f"{name}_is", None))


@dataclass(frozen=True)
class MoEWeights:
    """FP4MoE's weights checked and folded, as its two grouped problems take them: w13 [E, 2I, H]
    and w2 [E, H, I] (folded: the shared expert stacked as local expert E, E + 1 experts), w2's
    global scale `g2` with up/gate folded in; `apart` the shared expert for an FP4MLP."""

    w13: FP4Weight
    w2: FP4Weight
    g2: Tensor
    #: W4A4: per-expert input scales of w13 and w2 ([E], the shared expert's appended); else None
    is13: Tensor | None
    is2: Tensor | None
    bias13: Tensor | None
    bias2: Tensor | None
    routed: int                 # the routed experts (local)
    hidden: int
    intermediate: int
    shared_folded: bool
    apart: tuple | None         # `shared=` to run apart (an FP4MLP), or None
    apart_a_fmt: str = "bf16"   # that FP4MLP's activation format

    @property
    def experts(self) -> int:
        """Local experts the kernels see: the routed ones, and the shared one where folded in."""
        return self.routed + self.shared_folded

    @classmethod
    def of(cls, w13: FP4Weight, w2: FP4Weight, *, up_scale: Tensor | None = None, shared: tuple | None = None,
           fold_shared: bool | None = None, a_fmt: str = "bf16", bias13: Tensor | None = None,
           bias2: Tensor | None = None, shared_a_fmt: str | None = None) -> "MoEWeights":
        """The checks and folds of FP4MoE's constructor, each failure one line (ValueError);
        fold_shared=None folds where the shared expert fits the routed stack (I_s = I, one
        format) and always for W4A4 activations. Apart, the shared expert's FP4MLP runs
        `shared_a_fmt` (default: the routed experts', W4A16 where its weights carry no input
        scale, with a warning)."""
        if w13.num_experts is None or w2.num_experts is None or w13.packed.ndim != 3 or w2.packed.ndim != 3:
            raise ValueError(f"FP4MoE takes stacked experts w13 [E, 2I, H] and w2 [E, H, I]; got {w13.shape}, {w2.shape}")
        e, two_i, h = w13.shape
        if w2.shape != (e, h, two_i // 2) or two_i % 2 or w13.fmt != w2.fmt:
            raise ValueError(f"w2 {w2.shape} ({w2.fmt}) does not fit w13 {w13.shape} ({w13.fmt}): expected "
                             f"[{e}, {h}, {two_i // 2}] in one format")
        if fold_shared is None:             # measured: folded is faster at decode sizes (docs/fp4moe.md)
            fold_shared = a_fmt != "bf16" or (shared is not None and _foldable(shared, w13))
        s_fmt = shared_a_fmt
        if shared is not None and not fold_shared and s_fmt is None:
            has_is = all(getattr(w, "input_scale", None) is not None for w in shared[:2])
            s_fmt = a_fmt if a_fmt == "bf16" or has_is else "bf16"
            if s_fmt != a_fmt:
                warnings.warn(f"FP4MoE: the routed experts are W4A4 but the shared expert has no static input "
                              f"scales: it runs apart, W4A16", stacklevel=3)
        folded = shared is not None and bool(fold_shared)
        g2 = _fold_up(w13.global_scale, w2.global_scale, up_scale, e)
        is13, is2 = _input_scales(w13, w2, up_scale, shared if folded else None, e, a_fmt)
        if folded:                          # local expert E; the stacked copy replaces the inputs
            w13, w2, g2 = _fold_shared(w13, w2, g2, shared)
        n = e + folded
        for name, t, shape in (("bias13", bias13, (n, two_i)), ("bias2", bias2, (n, h))):
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"FP4MoE {name} is {tuple(t.shape)}, expected {shape}")
        return cls(w13, w2, g2, is13, is2,
                   None if bias13 is None else bias13.float().contiguous(),
                   None if bias2 is None else bias2.float().contiguous(),
                   e, h, two_i // 2, folded, shared if shared is not None and not folded else None, s_fmt or "bf16")

    def problems(self, top_k: int, a_fmt: str, fused: bool) -> tuple[Problem, Problem]:
        """The two grouped problems these weights serve at `top_k` routed slots (one more for the
        folded shared expert): w13 with the SwiGLU epilogue and w2 with the routing weights and the
        top_k sum (`fused`), or both plain."""
        slots, i = top_k + self.shared_folded, self.intermediate
        epi13, epi2 = ("swiglu", "reduce") if fused else ("none", "none")
        fmt = self.w13.fmt
        return (Problem.moe(2 * i, self.hidden, self.experts, slots, w_fmt=fmt, a_fmt=a_fmt, epilogue=epi13),
                Problem.moe(self.hidden, i, self.experts, slots, w_fmt=fmt, a_fmt=a_fmt, epilogue=epi2))

    @property
    def layout(self) -> BufferLayout:
        return BufferLayout(self.w13.fmt, self.w13.scales.dtype,
                            (("w13", tuple(self.w13.global_scale.shape)), ("w2", tuple(self.g2.shape))))

    def buffers(self) -> dict[str, Tensor | None]:
        """Every weight tensor by its buffer name, in registration order (None: an empty slot)."""
        return {**BufferLayout.buffers("w13", self.w13, self.w13.global_scale), **BufferLayout.buffers("w2", self.w2, self.g2),
                "bias13": self.bias13, "bias2": self.bias2, "w13_is": self.is13, "w2_is": self.is2}
