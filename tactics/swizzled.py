"""The "swizzled-128x4" weight layout: FP4 codes as they are, block scales in the 128x4 tiled
layout that CUTLASS (through FlashInfer) and cuBLASLt read, swizzled once when a layer is bound.

Shared by the `cutlass` and `cublaslt` families (`Family.layout` / `Family.pack`). Their
launchers take either this packed form (bound tables, FP4Linear: no swizzle per call) or a plain
FP4Weight (the `dispatch((M, N, K))(x, w)` form), which is swizzled once per weight object.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.core import formats
from autotune.core.formats import FP4Weight, unswizzle_128x4
from autotune.core.operands import check_weight

SWIZZLED_LAYOUT = "swizzled-128x4"


@dataclass(frozen=True, eq=False)
class SwizzledWeight:
    """An FP4Weight with its block scales in the 128x4 layout (flat uint8 [..., R*C],
    R = round_up(N, 128), C = round_up(K/block, 4), zero padding). `packed` is the source's own
    tensor when it is contiguous (no copy); only the scales take extra memory."""

    packed: Any                # uint8 [..., N, K/2]
    scales: Any                # uint8 [..., R*C], swizzled
    global_scale: Any
    fmt: str
    input_scale: Any
    n: int
    k: int

    @property
    def block(self) -> int:
        return 16 if self.fmt == "nvfp4" else 32

    def linear_scales(self) -> Any:
        """The block scales back in the linear [..., N, K/block] layout, in the format's dtype."""
        import torch
        dtype = torch.float8_e4m3fn if self.fmt == "nvfp4" else torch.uint8
        return unswizzle_128x4(self.scales, self.n, self.k // self.block, dtype)


def pack_swizzled(w: FP4Weight) -> SwizzledWeight:
    if not isinstance(w, FP4Weight):
        raise TypeError(f"the {SWIZZLED_LAYOUT} layout packs an FP4Weight, got {type(w).__name__}")
    c = w.contiguous()
    return SwizzledWeight(c.packed, formats.swizzle_128x4(c.scales), c.global_scale, c.fmt, c.input_scale, c.n, c.k)


class SwizzledCache:
    """The launchers' one-entry cache: a SwizzledWeight passes through; a plain FP4Weight is
    swizzled the first time it is seen and reused while the same object comes back."""

    def __init__(self) -> None:
        self._src: Any = None
        self._packed: SwizzledWeight | None = None

    def __call__(self, w: Any) -> SwizzledWeight:
        if isinstance(w, SwizzledWeight):
            return w
        if self._src is not w:
            self._packed, self._src = pack_swizzled(w), w
        assert self._packed is not None
        return self._packed


def check_bound_weight(problem: Any, w: Any, family: str) -> None:
    """Refuse a packed weight of another layout, or one that does not match the problem (the shared
    operand check, core.operands.check_weight: one line naming both shapes)."""
    if not isinstance(w, SwizzledWeight):
        raise TypeError(f"{family}: bind needs the {SWIZZLED_LAYOUT} packed weight, got {type(w).__name__}")
    check_weight(problem, w)


class SwizzledLayout:
    """Mixin (before FamilyBase) for families whose kernels read this layout: declares it, packs
    it once at bind, and refuses a packed weight of another layout or problem."""

    name: ClassVar[str]

    def layout(self, tactic: Any) -> str:
        return SWIZZLED_LAYOUT

    def pack(self, layout: str, weight: Any) -> Any:
        if layout != SWIZZLED_LAYOUT:
            return super().pack(layout, weight)  # type: ignore[misc]
        return pack_swizzled(weight)

    def bind(self, problem: Any, tactic: Any, packed: Any, device: str) -> Any:
        check_bound_weight(problem, packed, self.name)
        return super().bind(problem, tactic, packed, device)  # type: ignore[misc]
