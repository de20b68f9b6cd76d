"""Shared memory of the CUTLASS block-scaled FP4 kernels, computed the way CUTLASS computes it.

Two numbers per kernel, both compile-time constants in CUTLASS:
1. the builder's stage count: `StageCountAutoCarveout<sizeof(epilogue SharedStorage)>` in the
   SM120 / SM100 block-scaled collective builders,
       stages = (capacity - scheduler carve-out - epilogue carve-out) // stage_bytes
       stage_bytes = A + B + SFA + SFB + 128   (128 = the mainloop pipeline barrier, rounded)
2. the kernel's `SharedStorageSize` = sizeof(GemmKernel::SharedStorage): a 1,024-byte-aligned
   struct {pipelines (< 1 KiB), epilogue tensors, mainloop tensors (A, B aligned to 1,024 B,
   SFA, SFB aligned to 16 B)}. The builder's estimate leaves out that padding, which is why
   a kernel can be planned with one stage too many (NVIDIA/cutlass#3096, #3144).
A kernel is rejected when the builder picks fewer stages than the collective accepts (compile
error) or when SharedStorageSize exceeds the per-block opt-in limit (launch error).

Checked exactly against nvcc on every kernel of tactics/cutlass/smem_truth.json that it covers
(CUTLASS_VERSION); regenerate with tools/cutlass_smem_truth/gen.py. Verdicts never use this model
(autotune.tactics.cutlass.truth): it explains the table and predicts a kernel before it is compiled.
"""
from __future__ import annotations

from dataclasses import dataclass

from autotune.tactics.cutlass.candidates import Kernel

#: the CUTLASS release this model was checked against (bundled by FlashInfer 0.7.4)
CUTLASS_VERSION = "4.5.0"

#: cutlass/arch/arch.h sm*_smem_capacity_bytes
CAPACITY = {"sm120": 101_376, "sm100": 232_448}
#: a mainloop stage's pipeline barrier, round_up(sizeof(PipelineTmaUmmaAsync<1>::SharedStorage), 128)
PIPELINE_BYTES = 128
#: the collective's minimum stage count: SM120 static_asserts "Stages set to value 2 or more";
#: the SM100 builder static_asserts PipelineStages > 0
MIN_STAGES = {"sm120": 2, "sm100": 1}
BARRIER = 8          # sizeof(ClusterBarrier)
CLC_RESPONSE = 16    # sizeof(CLCResponse)
TMA_DESCRIPTOR = 128


def _up(v: int, a: int) -> int:
    return (v + a - 1) // a * a


def scheduler_carveout(k: Kernel) -> int:
    """Smem the builder subtracts before counting stages (everything but epilogue and mainloop)."""
    if k.kernel_arch == "sm100" and k.op == "grouped_moe":
        # Sm100DenseGemmTmaUmmaCarveout<..., IsArrayOfPointersGemm, 4 tensor maps>: scheduler
        # stages 8, two CLC responses, 4 x 5 tensor maps, tensor-map-ready pipeline
        acc = 1 if k.tile_n == 256 else 2
        return (2 * acc * BARRIER + 2 * (2 * 8 * BARRIER) + 2 * BARRIER + BARRIER + 2 * 8 * BARRIER
                + 8 * CLC_RESPONSE * 2 + 8 * 4 + TMA_DESCRIPTOR * 4 * 5 + 2 * 8 * BARRIER)
    if k.kernel_arch == "sm120":
        if k.op == "grouped_moe":
            # PipelineAsyncSharedStorage<8> + 2 tensor maps + PipelineAsync<3> (tensor-map ready)
            return 2 * 8 * BARRIER + 2 * TMA_DESCRIPTOR + 2 * 3 * BARRIER
        # PipelineCLCFetchAsync<3> + 3 CLC responses
        return 2 * 3 * BARRIER + 3 * CLC_RESPONSE
    # Sm100DenseGemmTmaUmmaCarveout, scheduler stages 2, accumulator stages 1 if MMA N == 256 else 2
    acc = 1 if k.tile_n == 256 else 2
    return (2 * acc * BARRIER          # accumulator pipeline
            + 2 * 2 * BARRIER          # CLC fetch pipeline
            + 2 * BARRIER              # load-order barrier OrderedSequenceBarrier<1,2>
            + BARRIER                  # TMEM dealloc barrier
            + 2 * 2 * BARRIER          # CLC throttle pipeline
            + 2 * CLC_RESPONSE         # CLC responses
            + 2 * 4)                   # TMEM base pointers


@dataclass(frozen=True)
class Epilogue:
    """sizeof(CollectiveEpilogue::SharedStorage), the builder's carve-out, and the bytes the
    epilogue's TensorStorage takes inside the kernel's SharedStorage."""

    carveout: int
    in_kernel: int
    align: int = 1024      # alignment of the epilogue tensors (sets the kernel tensor struct's)


#: Epilogue storage of the candidates (bf16 D; C void or bf16), printed by the nvcc probe
#: (tools/cutlass_smem_truth) for CUTLASS_VERSION. Keyed by (kernel arch, op, C, D layout, epilogue
#: subtile N). Derivation, where the source makes it plain: SM120 uses the SM90 TMA epilogue with
#: EpilogueTileAuto = 64 x 32 for CTA N >= 32: two D stages of bf16 (2 x 4 KiB), plus one C stage
#: when C is bf16, and an empty fusion storage that pads the 1,024-aligned tensor struct to the
#: next KiB (9,216 / 13,312). With swap_ab, C/D are column-major and the pipeline barriers no
#: longer fit that padding: the carve-out grows by 1 KiB, the in-kernel tensors do not. SM100's
#: 1-SM/2-SM TMA epilogue: 128 x 32 x 2 stages = 16 KiB of tensors, 17,408 with its barriers; the
#: 128 x 64 subtile FlashInfer forces for 128x256x256 takes 33,792 / 34,816.
_EPILOGUES: dict[tuple[str, str, str, str, int], Epilogue] = {
    ("sm120", "dense", "void", "row", 32): Epilogue(9_216, 9_216),
    ("sm120", "dense", "void", "col", 32): Epilogue(10_240, 9_216),
    ("sm120", "dense", "bf16", "row", 32): Epilogue(13_312, 13_312),
    ("sm120", "dense", "bf16", "col", 32): Epilogue(14_336, 13_312),
    ("sm120", "grouped_moe", "bf16", "row", 32): Epilogue(13_312, 13_312),
    ("sm120", "grouped_moe", "bf16", "col", 32): Epilogue(14_336, 13_312),
    ("sm100", "dense", "void", "row", 32): Epilogue(17_408, 16_384),
    ("sm100", "dense", "void", "row", 64): Epilogue(34_816, 33_792),
    # pointer-array TMA epilogue of the SM100 grouped kernels: + a 512-aligned empty fusion storage
    ("sm100", "grouped_moe", "void", "row", 32): Epilogue(17_408, 16_896, 512),
    ("sm100", "grouped_moe", "void", "row", 64): Epilogue(34_816, 33_792, 1024),
}


def epilogue_tile_n(k: Kernel) -> int:
    """N extent of the epilogue subtile: FlashInfer forces 128x64 on SM100 dense 128x256x256,
    TensorRT-LLM on every SM100 FP4 MoE tile with N = 256."""
    if k.kernel_arch == "sm100" and k.tile_n == 256 and (k.op == "grouped_moe" or k.tile_k == 256):
        return 64
    return 32


def epilogue(k: Kernel) -> Epilogue:
    if k.tile_n < 32:
        raise ValueError(f"epilogue of CTA N={k.tile_n} < 32 is not modeled (SM120 rejects N < 32 anyway)")
    key = (k.kernel_arch, k.op, k.epilogue_c, "col" if k.swap_ab else "row", epilogue_tile_n(k))
    if key not in _EPILOGUES:
        raise ValueError(f"no epilogue model for {key} (CUTLASS {CUTLASS_VERSION}); add it from the nvcc probe")
    return _EPILOGUES[key]


def builder_rule(k: Kernel) -> str | None:
    """Static rules of the builders that reject a kernel before any smem arithmetic."""
    if k.kernel_arch == "sm120":
        if k.tile_n < 32:
            return f"tile N {k.tile_n} < 32: CUTLASS SM120 builder static_asserts \"Invalid tile shape N.\""
        if k.tile_n % 32:
            # the tiled MMA's N permutation (sm120_tile_n_permute_selector) is 32 wide; nvcc: 128x48x128
            return f"tile N {k.tile_n} not a multiple of 32: CuTe static_asserts \"Divisibility Condition\""
        if k.tile_n > 128 and k.tile_n % 128:
            # the SFB smem tile is max(N, 128) in whole 128-row blocks; nvcc: 128x160x128, 128x192x128
            return (f"tile N {k.tile_n} > 128 not a multiple of 128 (SFB scale blocks): CuTe static_asserts "
                    f"\"Shape Divisibility Condition\"")
        if k.schedule == "cooperative" and k.tile_m < 128:
            return f"tile M {k.tile_m} < 128: the cooperative kernel needs M >= 128"
        if k.format == "nvfp4" and k.mma == "mxf8f6f4":
            return "NVFP4 (ue4m3 scales) on the mxf8f6f4 path: \"MX_F4F6F8 only supports ue8m0 SF type\""
        if k.format == "mxfp8_mxfp4" and k.mma != "mxf8f6f4":
            return "an 8-bit operand needs the mxf8f6f4 MMA"
    else:
        if k.mma != "mxf4nvf4" or k.format == "mxfp8_mxfp4":
            return "only the mxf4nvf4 SM100 kernels (FlashInfer's FP4 x FP4) are modeled"
        if k.tile_m != 128:
            return f"SM100 per-CTA tile M must be 128, got {k.tile_m}"
        if k.tile_n not in (64, 128, 192, 256):
            # sm100_make_blockscaled_{1,2}sm_trivial_tiled_mma (nvcc's message in the truth table)
            return (f"tile N {k.tile_n} not in 64/128/192/256: CUTLASS SM100 block-scaled builder static_asserts "
                    f"\"Invalid TileShape_N.\"")
    return None


@dataclass(frozen=True)
class Smem:
    stage_bytes: int       # the builder's per-stage estimate (incl. the 128 B barrier)
    capacity: int          # capacity minus scheduler carve-out: what the stages share with the epilogue
    epilogue_carveout: int
    stages: int
    kernel_bytes: int | None   # SharedStorageSize; None when the builder picks too few stages
    limit: int


def sfb_tile_n(k: Kernel) -> int:
    """N extent of the SFB scale tile (whole MMA N, in 128-row scale blocks). SM100 rounds up
    (`MMA_N_SFB = ceil_div(N, 128) * 128`: N 192 moves SFB as if N were 256; nvcc agrees on the 1-SM
    and 2-SM 128x192x128 kernels, which max(N, 128) under-counted by 6 KiB); SM120 takes max(N, 128)
    (`sSFBTileShape_N`), and a larger N that is not a multiple of 128 does not compile."""
    if k.kernel_arch == "sm100":
        return _up(k.tile_n, 128)
    return max(k.tile_n, 128)


def per_stage(k: Kernel) -> tuple[int, int, int, int]:
    """(A, B, SFA, SFB) bytes of one stage, per CTA."""
    bits = 4 if k.mma == "mxf4nvf4" else 8           # the k32 mxf8f6f4 path stores a byte per element
    vec = 16 if k.format == "nvfp4" else 32
    m, n, kk = k.tile_m, k.tile_n, k.tile_k
    n_b = n // 2 if k.schedule == "2sm" else n        # a 2-SM MMA splits B's N over the CTA pair
    a = bits * m * kk // 8
    b = bits * n_b * kk // 8
    sfa = m * kk // vec
    sfb = sfb_tile_n(k) * kk // vec
    return a, b, sfa, sfb


#: SM120 tile N the model was checked on; a 128x96 kernel compiles with 1 KiB more in its mainloop
#: storage than the arithmetic below explains (nvcc rows), so the model declines other N
SM120_MODELED_N = (32, 64, 128, 256)


def model(k: Kernel) -> Smem:
    if k.kernel_arch == "sm120" and k.tile_n not in SM120_MODELED_N:
        raise ValueError(f"not modeled: SM120 tile N {k.tile_n} (checked on {SM120_MODELED_N}; nvcc's row decides)")
    a, b, sfa, sfb = per_stage(k)
    stage = a + b + sfa + sfb + PIPELINE_BYTES
    cap = CAPACITY[k.kernel_arch] - scheduler_carveout(k)
    epi = epilogue(k)
    stages = (cap - epi.carveout) // stage
    kernel = None
    if stages >= MIN_STAGES[k.kernel_arch]:
        kernel = kernel_bytes(k, stages, epi)
    return Smem(stage, cap, epi.carveout, stages, kernel, CAPACITY[k.kernel_arch])


def mainloop_tensor_bytes(k: Kernel, stages: int) -> int:
    """sizeof(CollectiveMainloop::TensorStorage): SM120 aligns smem_A/smem_B to 1,024 B and the
    scale arrays to 16 B; SM100 packs the four arrays in a 128-byte-aligned struct."""
    a, b, sfa, sfb = (stages * v for v in per_stage(k))
    if k.kernel_arch == "sm120":
        off = _up(_up(a, 1024) + b, 16) + sfa
        return _up(_up(off, 16) + sfb, 1024)
    return _up(a + b + sfa + sfb, 128)


def kernel_bytes(k: Kernel, stages: int, epi: Epilogue) -> int:
    """GemmKernel::SharedStorageSize."""
    main = mainloop_tensor_bytes(k, stages)
    if k.kernel_arch == "sm100" and k.op == "grouped_moe":
        # sm100_gemm_array_tma_warpspecialized: {pipelines (16 B per mainloop and accumulator
        # stage + 368), CLC responses (320), tmem pointer, 5 x 768 B of tensor maps (aligned 128),
        # tensors (epilogue, then mainloop; aligned to the epilogue's alignment)}; offsets as the
        # probe printed them with offsetof()
        acc = 1 if k.tile_n == 256 else 2
        pipelines = 16 * stages + 16 * acc + 368
        tensormaps = _up(pipelines + 320 + 4, 128)
        tensors = _up(tensormaps + 5 * 768, epi.align)
        return tensors + _up(epi.in_kernel + main, epi.align)
    if k.op == "grouped_moe":
        # SM90 pointer-array kernel: {mainloop tensors, epilogue tensors} first, then pipelines,
        # scheduler responses and 7 tensor maps (4 mainloop, C and 2 D): > 1 KiB, padded to 2 KiB
        return _up(main + _up(epi.in_kernel, 1024) + GROUPED_TAIL, 1024)
    # pipelines and scheduler storage (< 1 KiB) ahead of the 1,024-aligned tensors
    return 1024 + _up(epi.in_kernel, 1024) + main


#: bytes after the tensors in the grouped SM120 kernel (fitted: see kernel_bytes)
GROUPED_TAIL = 2048
