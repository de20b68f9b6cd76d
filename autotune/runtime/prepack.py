"""Weight layouts per tactic, prepared once at load time and never per call.

Each family names the layout its kernels read (`layout_of(tactic)`); `pack(layout, w)` turns an
FP4Weight into that layout. A layer keeps one packed copy per distinct layout among the winners
of its buckets (plus its default's), so buckets whose winners want different layouts each get
theirs. Families without a registered layout read the FP4Weight as it is ("fp4-linear").

Layouts today:
  fp4-linear      FP4Weight with contiguous tensors (torch family). Views of the source when it
                  is already contiguous: 0 extra bytes.
  fp4-linear-u8   packed codes, scales reinterpreted as uint8, global scale as fp32 [1] on the
                  weight's device (triton family): what its launcher otherwise converts on every
                  call. Views again: 0 extra bytes for a contiguous source.
  swizzled-128x4  block scales in the 128x4 tiled layout that CUTLASS / cuBLASLt / FlashInfer FP4
                  kernels read (issue #5's families register it): one extra copy of the scales,
                  round_up(N,128) * round_up(K/block,4) bytes per expert.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from autotune.core.formats import FP4Weight, swizzle_128x4
from autotune.core.tactic import Tactic

DEFAULT_LAYOUT = "fp4-linear"


@dataclass(frozen=True, eq=False)
class U8Weight:
    """What the triton launcher reads: duck-types FP4Weight's packed/scales/global_scale/fmt."""

    packed: torch.Tensor
    scales: torch.Tensor        # uint8 view of the e4m3 / e8m0 block scales
    global_scale: torch.Tensor  # fp32 [1]
    fmt: str
    input_scale: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class SwizzledWeight:
    packed: torch.Tensor
    scales: torch.Tensor        # uint8 [..., round_up(N,128) * round_up(K/block,4)]
    global_scale: torch.Tensor
    fmt: str
    n: int
    k: int


def _linear(w: FP4Weight) -> FP4Weight:
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731 - no copy when already contiguous
    return FP4Weight(c(w.packed), c(w.scales), c(w.global_scale), w.fmt, c(w.input_scale))


def _u8(w: FP4Weight) -> U8Weight:
    s = w.scales.contiguous()
    s = s if s.dtype == torch.uint8 else s.view(torch.uint8)
    g = w.global_scale.to(torch.float32).reshape(-1).contiguous()
    return U8Weight(w.packed.contiguous(), s, g, w.fmt, w.input_scale)


def _swizzled(w: FP4Weight) -> SwizzledWeight:
    return SwizzledWeight(w.packed.contiguous(), swizzle_128x4(w.scales), w.global_scale.contiguous(),
                          w.fmt, w.n, w.k)


PACKERS: dict[str, Callable[[FP4Weight], object]] = {
    "fp4-linear": _linear,
    "fp4-linear-u8": _u8,
    "swizzled-128x4": _swizzled,
}
#: family -> layout of its tactics (a function of the tactic, for families with several)
FAMILY_LAYOUT: dict[str, Callable[[Tactic], str]] = {
    "torch": lambda t: "fp4-linear",
    "triton": lambda t: "fp4-linear-u8",
}


def register(family: str, layout: str | Callable[[Tactic], str],
             packer: Callable[[FP4Weight], object] | None = None) -> None:
    """Declare the layout a family's kernels read (and how to produce it, if new)."""
    if packer is not None:
        PACKERS[layout if isinstance(layout, str) else family] = packer
    FAMILY_LAYOUT[family] = (lambda t, _l=layout: _l) if isinstance(layout, str) else layout


def layout_of(tactic: Tactic) -> str:
    f = FAMILY_LAYOUT.get(tactic.family)
    return f(tactic) if f is not None else DEFAULT_LAYOUT


def pack(layout: str, w: FP4Weight) -> object:
    try:
        return PACKERS[layout](w)
    except KeyError:
        raise ValueError(f"unknown weight layout {layout!r}; known: {', '.join(PACKERS)}") from None


def pack_all(layouts: tuple[str, ...], w: FP4Weight) -> list[object]:
    """One packed weight per layout slot (the order of `Table.layouts`)."""
    return [pack(lay, w) for lay in layouts]


def _tensors(obj) -> list[torch.Tensor]:
    return [v for v in vars(obj).values() if isinstance(v, torch.Tensor)] if hasattr(obj, "__dict__") else \
        [getattr(obj, f) for f in obj.__dataclass_fields__ if isinstance(getattr(obj, f), torch.Tensor)]


def extra_bytes(source: FP4Weight, packs: list[object]) -> int:
    """Bytes the packed copies hold beyond the source weight's own storage (shared storage counts 0)."""
    seen = {t.untyped_storage().data_ptr() for t in _tensors(source)}
    total = 0
    for p in packs:
        for t in _tensors(p):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
    return total
