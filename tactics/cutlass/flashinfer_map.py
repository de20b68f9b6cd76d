"""FlashInfer's integer CUTLASS tactics <-> our self-describing kernels.

FlashInfer's `mm_fp4(..., backend="cutlass")` runner takes `tactic: int`, an index into the C++
`CutlassFp4GemmRunner::getConfigs()` vector of the module built for the device's arch. The index
means nothing outside one FlashInfer release and arch, so the cache stores the kernel's fields
(tile M/N/K in elements, schedule, swap_ab, scheduler, cluster) and re-derives the index here at
build time. The lists below are read from the FlashInfer 0.7.4 wheel's headers.
"""
from __future__ import annotations

from tactics.cutlass.candidates import (FI_SM100_TILES, FI_SM120_TILES, FI_SM120_VARIANTS, Kernel,
                                        sm100_dense)

#: the FlashInfer release whose getConfigs() order this module reproduces
FLASHINFER_VERSION = "0.7.4"


def _sm120_list() -> list[Kernel]:
    out = []
    for m, n, k, _ in FI_SM120_TILES:
        for swap, sk in FI_SM120_VARIANTS:
            out.append(Kernel("sm120", "dense", m, n, k, "nvfp4", "mxf4nvf4", "cooperative",
                              "streamk" if sk else "dp", "void", swap))
    return out


SM120_DENSE: tuple[Kernel, ...] = tuple(_sm120_list())
SM100_DENSE: tuple[Kernel, ...] = tuple(sm100_dense("nvfp4"))


def configs(kernel_arch: str) -> tuple[Kernel, ...]:
    """FlashInfer's mm_fp4 CUTLASS config list for an arch, in index order."""
    if kernel_arch == "sm120":
        return SM120_DENSE
    if kernel_arch == "sm100":
        return SM100_DENSE
    raise ValueError(f"FlashInfer {FLASHINFER_VERSION} has no CUTLASS FP4 mm list for {kernel_arch!r}")


def to_index(k: Kernel) -> int | None:
    """FlashInfer's integer tactic for a kernel, or None when its mm_fp4 runner does not build it."""
    try:
        return configs(k.kernel_arch).index(k)
    except ValueError:
        return None


def from_index(kernel_arch: str, index: int) -> Kernel:
    """Our kernel for FlashInfer's integer tactic (-1 is FlashInfer's fallback, 128x128x128 DP)."""
    cs = configs(kernel_arch)
    if index == -1:
        if kernel_arch == "sm120":   # dispatch default: DISPATCH_WITH_SCHEDULER(128, 128, 128), no swap
            return Kernel("sm120", "dense", 128, 128, 128, "nvfp4", "mxf4nvf4", "cooperative", "dp", "void", False)
        raise ValueError(f"FlashInfer's -1 fallback on {kernel_arch} is a heuristic choice, not one kernel")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cs):
        raise ValueError(f"FlashInfer {FLASHINFER_VERSION} {kernel_arch} tactic must be in -1..{len(cs) - 1}, "
                         f"got {index!r}")
    return cs[index]


def enum_name(k: Kernel) -> str:
    """FlashInfer's CutlassTileConfigSM1xx name for the tile (K in its byte convention)."""
    table = FI_SM120_TILES if k.kernel_arch == "sm120" else FI_SM100_TILES
    for m, n, kk, name in table:
        if (m, n, kk) == (k.tile_m, k.tile_n, k.tile_k):
            return name
    raise ValueError(f"no FlashInfer tile name for {k.tile_m}x{k.tile_n}x{k.tile_k} on {k.kernel_arch}")
