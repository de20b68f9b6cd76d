"""FlashInfer's integer CUTLASS tactics <-> our self-describing kernels.

FlashInfer's `mm_fp4(..., backend="cutlass")` runner takes `tactic: int`, an index into the C++
`CutlassFp4GemmRunner::getConfigs()` vector of the module built for the device's arch. The index
means nothing outside one FlashInfer release and arch, so the cache stores the kernel's fields
(tile M/N/K in elements, schedule, swap_ab, scheduler, cluster) and re-derives the index here at
build time. The lists are read from each supported FlashInfer wheel's own headers
(VERSIONS below); `sm120_configs_from_header` re-reads a header so that a test can check the
table against an installed wheel.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from autotune.tactics.cutlass.candidates import (FI_SM100_TILES, FI_SM120_TILES, FI_SM120_VARIANTS, Kernel,
                                        sm100_dense)

#: the FlashInfer release the family executes through (FlashInferMmFp4); the others in VERSIONS
#: are export targets (autotune.integrations.flashinfer)
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


@dataclass(frozen=True)
class FlashInferRelease:
    """One flashinfer-python release's CUTLASS FP4 mm tactic lists and where they were read."""

    version: str
    sm120: tuple[Kernel, ...]
    sm100: tuple[Kernel, ...]
    source: str           # the files (inside the wheel) the lists were read from
    template_note: str    # what differs in the kernels themselves from the other releases


_SRC = ("flashinfer/data/include/flashinfer/gemm/fp4_gemm_cutlass_template_sm120.h getConfigs(); "
        "flashinfer/data/include/flashinfer/gemm/fp4_gemm_cutlass_template.h getConfigs()")

#: every release whose integer tactics this module can name. 0.7.2.post1 (the release vLLM 0.33
#: pins) was read from its own wheel: the SM120 and SM100 lists equal 0.7.4's, index for index, but
#: fp4_gemm_template_sm120.h launches differently (0.7.2.post1: gemm.run(args, workspace, stream,
#: ...), re-initializing per call; 0.7.4: gemm.run(stream, ...)), so a timing measured under one
#: release is a measurement of the other's kernel only approximately.
VERSIONS: dict[str, FlashInferRelease] = {
    "0.7.2.post1": FlashInferRelease("0.7.2.post1", SM120_DENSE, SM100_DENSE, _SRC,
                                     "SM120 launch: gemm.run(args, workspace, stream, nullptr, PDL)"),
    "0.7.4": FlashInferRelease("0.7.4", SM120_DENSE, SM100_DENSE, _SRC,
                               "SM120 launch: gemm.run(stream, nullptr, PDL) after initialize()"),
}


def release(version: str) -> FlashInferRelease:
    """The release record, or ValueError naming the supported releases."""
    r = VERSIONS.get(str(version).split("+")[0])
    if r is None:
        raise ValueError(f"flashinfer-python {version} is not supported: its CUTLASS tactic integers are "
                         f"known for {', '.join(VERSIONS)} only")
    return r


def configs(kernel_arch: str, version: str = FLASHINFER_VERSION) -> tuple[Kernel, ...]:
    """FlashInfer's mm_fp4 CUTLASS config list for an arch, in index order."""
    r = release(version)
    if kernel_arch == "sm120":
        return r.sm120
    if kernel_arch == "sm100":
        return r.sm100
    raise ValueError(f"FlashInfer {r.version} has no CUTLASS FP4 mm list for {kernel_arch!r}")


def to_index(k: Kernel, version: str = FLASHINFER_VERSION) -> int | None:
    """FlashInfer's integer tactic for a kernel, or None when its mm_fp4 runner does not build it."""
    try:
        return configs(k.kernel_arch, version).index(k)
    except ValueError:
        return None


def from_index(kernel_arch: str, index: int, version: str = FLASHINFER_VERSION) -> Kernel:
    """Our kernel for FlashInfer's integer tactic (-1 is FlashInfer's fallback, 128x128x128 DP)."""
    cs = configs(kernel_arch, version)
    if index == -1:
        if kernel_arch == "sm120":   # dispatch default: DISPATCH_WITH_SCHEDULER(128, 128, 128), no swap
            return Kernel("sm120", "dense", 128, 128, 128, "nvfp4", "mxf4nvf4", "cooperative", "dp", "void", False)
        raise ValueError(f"FlashInfer's -1 fallback on {kernel_arch} is a heuristic choice, not one kernel")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cs):
        raise ValueError(f"FlashInfer {version} {kernel_arch} tactic must be in -1..{len(cs) - 1}, "
                         f"got {index!r}")
    return cs[index]


def enum_name(k: Kernel) -> str:
    """FlashInfer's CutlassTileConfigSM1xx name for the tile (K in its byte convention)."""
    table = FI_SM120_TILES if k.kernel_arch == "sm120" else FI_SM100_TILES
    for m, n, kk, name in table:
        if (m, n, kk) == (k.tile_m, k.tile_n, k.tile_k):
            return name
    raise ValueError(f"no FlashInfer tile name for {k.tile_m}x{k.tile_n}x{k.tile_k} on {k.kernel_arch}")


_ENUM_TILE = re.compile(r"CutlassTileConfigSM120::(CtaShape\w+)")
_PUSH = re.compile(r"CutlassGemmConfig\(\s*tile_config\s*,[^;]*?clusterShape\s*,\s*(true|false)\s*,\s*(true|false)\s*\)")


def sm120_configs_from_header(text: str) -> list[tuple[str, bool, bool]]:
    """(tile enum name, swap_ab, stream_k) in index order, read from a FlashInfer
    fp4_gemm_cutlass_template_sm120.h: the tile vector of getConfigs() times its push_back order."""
    body = text[text.index("::getConfigs() const"):]
    body = body[:body.index("return candidateConfigs;")]
    tiles = _ENUM_TILE.findall(body[:body.index("};")])
    pushes = [(a == "true", b == "true") for a, b in _PUSH.findall(body)]
    if not tiles or not pushes:
        raise ValueError("no SM120 getConfigs() tile list or push_back order found in the header")
    return [(t, swap, sk) for t in tiles for swap, sk in pushes]


def sm120_names(version: str) -> list[tuple[str, bool, bool]]:
    """The table's SM120 list in the form sm120_configs_from_header returns."""
    return [(enum_name(k), k.swap_ab, k.scheduler == "streamk") for k in configs("sm120", version)]
