"""The CUTLASS candidate lists that FlashInfer and TensorRT-LLM build, as self-describing kernels.

Sources (FlashInfer 0.7.4 wheel, which bundles CUTLASS 4.5.0 and TensorRT-LLM's MoE code):
- SM120 dense `mm_fp4`: include/flashinfer/gemm/fp4_gemm_cutlass_template_sm120.h `getConfigs()`:
  8 tiles x swap_ab {T,F} x {data-parallel persistent, stream-K}, cooperative, C = void.
- SM120 dense, TensorRT-LLM heuristic list (`get_candidate_configs_sm120`): 10 tiles, two more
  than FlashInfer (128x128x256B, 256x128x128B in its byte naming).
- SM120 grouped MoE: moe_gemm_tma_ws_launcher.inl whitelist 128x{32,64,128}x{128,256},
  128x256x128, 256x128x128 (elements); NVFP4 x NVFP4, or MXFP8 activations x MXFP4 weights.
- SM100 dense `mm_fp4`: fp4_gemm_cutlass_template.h: 4 tiles x 8 cluster shapes; 2-SM MMA when
  the cluster's M extent is >= 2.
- SM100 grouped MoE (NVFP4): cutlass_heuristic.cpp get_candidate_configs_sm100 (FP4_ONLY),
  128x{64,128,256}x128B, 1-SM and 2-SM.

Names in those projects give K in *bytes of 8-bit data* on SM120 (`CtaShape128x128x64B` = K 128
FP4 elements) while the SM100 dispatch passes the number through as FP4 elements
(`CtaShape128x64x128B` -> K 128). Our tactics always carry K in elements.
"""
from __future__ import annotations

from dataclasses import dataclass

#: (M, N, K in FP4 elements) in FlashInfer's SM120 getConfigs() order, with FlashInfer's enum name
FI_SM120_TILES: tuple[tuple[int, int, int, str], ...] = (
    (128, 32, 128, "CtaShape128x32x64B"), (128, 32, 256, "CtaShape128x32x128B"),
    (128, 64, 128, "CtaShape128x64x64B"), (128, 64, 256, "CtaShape128x64x128B"),
    (128, 128, 128, "CtaShape128x128x64B"), (128, 128, 256, "CtaShape128x128x128B"),
    (256, 128, 128, "CtaShape256x128x64B"), (128, 256, 128, "CtaShape128x256x64B"),
)
#: (swap_ab, stream_k) for each tile, in getConfigs() push order
FI_SM120_VARIANTS: tuple[tuple[bool, bool], ...] = ((True, False), (False, False), (True, True), (False, True))
#: TensorRT-LLM's SM120 list adds these (its K=256B tiles; the pre-#12141 dense list was exactly these two)
TRTLLM_SM120_EXTRA: tuple[tuple[int, int, int], ...] = ((128, 128, 512), (256, 128, 256))
#: TensorRT-LLM SM120 grouped-MoE whitelist (are_tile_shapes_supported_sm120), elements
TRTLLM_SM120_MOE_TILES: tuple[tuple[int, int, int], ...] = (
    (128, 32, 128), (128, 32, 256), (128, 64, 128), (128, 64, 256), (128, 128, 128), (128, 128, 256),
    (128, 256, 128), (256, 128, 128),
)
#: FlashInfer SM100 tiles (per-CTA M, N, K elements) and cluster shapes, getConfigs() order
FI_SM100_TILES: tuple[tuple[int, int, int, str], ...] = (
    (128, 64, 128, "CtaShape128x64x128B"), (128, 256, 128, "CtaShape128x256x128B"),
    (128, 128, 256, "CtaShape128x128x256B"), (128, 256, 256, "CtaShape128x256x256B"),
)
#: TensorRT-LLM SM100 grouped-MoE FP4 tiles (get_candidate_configs_sm100, FP4_ONLY): CtaShape128x
#: {64,128,256}x128B, 1-SM and 2-SM; the MoE dispatch converts K bytes to elements for the input
#: type (128 B of FP4 = 256 elements)
TRTLLM_SM100_MOE_TILES: tuple[tuple[int, int, int], ...] = ((128, 64, 256), (128, 128, 256), (128, 256, 256))
FI_SM100_CLUSTERS: tuple[str, ...] = ("1x1x1", "1x2x1", "2x1x1", "2x2x1", "1x4x1", "4x2x1", "2x4x1", "4x4x1")
#: FlashInfer moves these indices of the tile x cluster product to the front (getConfigs())
FI_SM100_BEST_FIRST: tuple[int, ...] = (22, 20, 29, 4, 18)

FORMATS = ("nvfp4", "mxfp4", "mxfp8_mxfp4")
MMAS = ("mxf4nvf4", "mxf8f6f4")
SCHEDULES = ("cooperative", "pingpong", "1sm", "2sm")
SCHEDULERS = ("dp", "streamk")
EPILOGUE_C = ("void", "bf16")
OPS = ("dense", "grouped_moe")
KERNEL_ARCHS = ("sm100", "sm120")


@dataclass(frozen=True)
class Kernel:
    """One CUTLASS kernel configuration; every field is a template parameter of the kernel."""

    kernel_arch: str          # "sm120" (also runs on sm121) or "sm100"
    op: str                   # "dense" | "grouped_moe"
    tile_m: int               # per-CTA tile M; a 2-SM MMA tile is 2 * tile_m
    tile_n: int
    tile_k: int               # elements, never bytes
    format: str               # nvfp4 | mxfp4 | mxfp8_mxfp4 (MXFP8 activations x MXFP4 weights)
    mma: str                  # mxf4nvf4 (4-bit x 4-bit, k64) | mxf8f6f4 (8-bit smem path, k32)
    schedule: str             # cooperative | pingpong (SM120) | 1sm | 2sm (SM100)
    scheduler: str = "dp"     # dp (persistent data-parallel) | streamk
    epilogue_c: str = "void"  # void | bf16 (source operand C read by the epilogue)
    swap_ab: bool = False
    cluster: str = "1x1x1"

    def params(self) -> dict:
        return {"kernel_arch": self.kernel_arch, "op": self.op, "tile_m": self.tile_m,
                "tile_n": self.tile_n, "tile_k": self.tile_k, "format": self.format, "mma": self.mma,
                "schedule": self.schedule, "scheduler": self.scheduler, "epilogue_c": self.epilogue_c,
                "swap_ab": self.swap_ab, "cluster": self.cluster}

    @classmethod
    def from_params(cls, p: dict) -> "Kernel":
        return cls(**{k: p[k] for k in cls.__dataclass_fields__})

    @classmethod
    def from_smem_key(cls, key: str) -> "Kernel":
        """The kernel a truth-table row names (its cluster is 1x1x1, or 2x1x1 for a 2-SM kernel:
        the cluster size does not change shared memory)."""
        try:
            arch, op, fmt, mma, sched, scheduler, c, swap, tile = key.split("/")
            m, n, k = (int(v) for v in tile.split("x"))
        except ValueError:
            raise ValueError(f"not a CUTLASS smem key: {key!r}") from None
        return cls(arch, op, m, n, k, fmt, mma, sched, scheduler, c.removeprefix("c"), swap == "swap",
                   "2x1x1" if sched == "2sm" else "1x1x1")

    @property
    def smem_key(self) -> str:
        """The fields that shape shared memory (cluster size does not: it is dynamic on SM100)."""
        return (f"{self.kernel_arch}/{self.op}/{self.format}/{self.mma}/{self.schedule}/{self.scheduler}/"
                f"c{self.epilogue_c}/{'swap' if self.swap_ab else 'noswap'}/"
                f"{self.tile_m}x{self.tile_n}x{self.tile_k}")


def sm120_dense(fmt: str) -> list[Kernel]:
    """FlashInfer's 32 SM120 mm_fp4 kernels (for nvfp4), then TensorRT-LLM's two extra tiles;
    for mxfp4 the same tiles on both MMA paths (FlashInfer 0.7.4 builds NVFP4 only on SM120)."""
    tiles = [(m, n, k) for m, n, k, _ in FI_SM120_TILES] + list(TRTLLM_SM120_EXTRA)
    mmas = ("mxf4nvf4",) if fmt == "nvfp4" else ("mxf4nvf4", "mxf8f6f4")
    out = []
    for mma in mmas:
        for m, n, k in tiles:
            for swap, sk in FI_SM120_VARIANTS:
                out.append(Kernel("sm120", "dense", m, n, k, fmt, mma, "cooperative",
                                  "streamk" if sk else "dp", "void", swap))
    return out


def sm120_moe(fmt: str) -> list[Kernel]:
    """TensorRT-LLM's SM120 grouped-MoE kernels: C = D = bf16, KernelScheduleAuto (cooperative)."""
    fmt_, mma = ("nvfp4", "mxf4nvf4") if fmt == "nvfp4" else ("mxfp8_mxfp4", "mxf8f6f4")
    return [Kernel("sm120", "grouped_moe", m, n, k, fmt_, mma, "cooperative", "dp", "bf16", swap)
            for m, n, k in TRTLLM_SM120_MOE_TILES for swap in (False, True)]


def sm100_dense(fmt: str) -> list[Kernel]:
    """FlashInfer's 32 SM100 mm_fp4 kernels in its getConfigs() order (best-first indices moved up)."""
    base = []
    for m, n, k, _ in FI_SM100_TILES:
        for c in FI_SM100_CLUSTERS:
            two = int(c.split("x")[0]) >= 2
            base.append(Kernel("sm100", "dense", m, n, k, fmt, "mxf4nvf4", "2sm" if two else "1sm",
                               "dp", "void", False, c))
    order = list(FI_SM100_BEST_FIRST) + [i for i in range(len(base)) if i not in FI_SM100_BEST_FIRST]
    return [base[i] for i in order]


def sm100_moe(fmt: str) -> list[Kernel]:
    """TensorRT-LLM's SM100 NVFP4 grouped-MoE kernels (TMA epilogue, C void); MXFP4 not listed."""
    if fmt != "nvfp4":
        return []
    return [Kernel("sm100", "grouped_moe", m, n, k, "nvfp4", "mxf4nvf4", sched, "dp", "void", False,
                   "2x1x1" if sched == "2sm" else "1x1x1")
            for m, n, k in TRTLLM_SM100_MOE_TILES for sched in ("1sm", "2sm")]


def all_kernels() -> list[Kernel]:
    """Every kernel the family can enumerate, on every arch (used by the truth generator)."""
    ks = sm120_dense("nvfp4") + sm120_dense("mxfp4") + sm120_moe("nvfp4") + sm120_moe("mxfp4")
    ks += sm100_dense("nvfp4") + sm100_dense("mxfp4") + sm100_moe("nvfp4")
    return ks


def truth_extras() -> list[Kernel]:
    """Variants outside the lists that pin down the model's other axes: bf16 C (CUTLASS example
    79a; MXFP4 128x128x128 lands on exactly 101,376 B), pingpong, and the 8-bit path at K=128."""
    out = []
    for m, n, k, _ in FI_SM120_TILES:
        out.append(Kernel("sm120", "dense", m, n, k, "nvfp4", "mxf4nvf4", "cooperative", "dp", "bf16"))
        out.append(Kernel("sm120", "dense", m, n, k, "mxfp4", "mxf4nvf4", "cooperative", "dp", "bf16"))
        out.append(Kernel("sm120", "dense", m, n, k, "mxfp4", "mxf8f6f4", "cooperative", "dp", "bf16"))
        out.append(Kernel("sm120", "dense", m, n, k, "nvfp4", "mxf4nvf4", "pingpong", "dp", "void"))
    return out


def offlist_neighbours() -> list[Kernel]:
    """22 kernels just outside the lists, compiled so that their verdicts are exact rather than
    unknown (an adversarial review named each group):
    - SM120 bf16 C with swap_ab (column-major C/D): NVFP4 at 4 FlashInfer tiles, MXFP4 at the
      128x128x128 tile that lands exactly on the limit without swap;
    - SM120 tile N not a multiple of 128 (the SFB scale tile is not N rounded up): NVFP4 160, 192,
      96, 48 and MXFP4 192, 96 at 128xNx128;
    - SM100 bf16 C: FlashInfer's 4 tiles (1-SM, and 2-SM for 128x256x256);
    - SM100 tile N < 32: 128x16x128 1-SM and 2-SM, 128x8x128 1-SM;
    - SM100 tile N not a multiple of 128: 128x192x128 1-SM and 2-SM, 128x96x128, 128x160x128.
    """
    def k120(m, n, k, fmt="nvfp4", c="void", swap=False):
        return Kernel("sm120", "dense", m, n, k, fmt, "mxf4nvf4", "cooperative", "dp", c, swap)

    def k100(m, n, k, sched="1sm", c="void"):
        return Kernel("sm100", "dense", m, n, k, "nvfp4", "mxf4nvf4", sched, "dp", c, False,
                      "2x1x1" if sched == "2sm" else "1x1x1")

    out = [k120(m, n, k, c="bf16", swap=True) for m, n, k in ((128, 32, 128), (128, 128, 128), (128, 256, 128),
                                                              (256, 128, 128))]
    out.append(k120(128, 128, 128, "mxfp4", "bf16", True))
    out += [k120(128, n, 128) for n in (160, 192, 96, 48)]
    out += [k120(128, n, 128, "mxfp4") for n in (192, 96)]
    out += [k100(128, 64, 128, c="bf16"), k100(128, 128, 256, c="bf16"), k100(128, 256, 128, c="bf16"),
            k100(128, 256, 256, "2sm", c="bf16")]
    out += [k100(128, 16, 128), k100(128, 16, 128, "2sm"), k100(128, 8, 128)]
    out += [k100(128, 192, 128), k100(128, 192, 128, "2sm"), k100(128, 96, 128), k100(128, 160, 128)]
    return out
