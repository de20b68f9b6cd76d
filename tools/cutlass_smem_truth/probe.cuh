// Host-only probes: instantiate the CUTLASS collective builders the way FlashInfer 0.7.x and
// TensorRT-LLM do, and print the builder's Stages and the kernel's SharedStorageSize as one
// JSON line per candidate. No kernel is launched or instantiated for the device; the numbers
// are compile-time constants. gen.py writes one .cu per batch that includes this header and
// calls probe_*<...>("name") for each candidate.
#pragma once
#include <cstdio>
#include "cutlass/cutlass.h"
#include "cutlass/arch/arch.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

using namespace cute;

// -DFORCE_FULL=1 instantiates the collective even below 2 stages, so nvcc shows the static_assert.
#ifndef FORCE_FULL
#define FORCE_FULL 0
#endif

// The builder's dispatch policy, read from the CollectiveMma *type* without instantiating the
// collective: that instantiation is where "Stages set to value 2 or more" fires.
template <class T> struct PolicyOf;
template <class D, class... R>
struct PolicyOf<cutlass::gemm::collective::CollectiveMma<D, R...>> { using type = D; };

template <class Main, class Epi, class Kernel>
void report(const char* name) {
  constexpr int stages = PolicyOf<Main>::type::Stages;
  constexpr int epi = int(sizeof(typename Epi::SharedStorage));
  if constexpr (stages >= 2 || FORCE_FULL) {
    std::printf("{\"name\":\"%s\",\"stages\":%d,\"epi_smem\":%d,\"mainloop_smem\":%d,\"kernel_smem\":%d}\n",
                name, stages, epi, int(sizeof(typename Main::SharedStorage)),
                int(Kernel::SharedStorageSize));
  } else {
    std::printf("{\"name\":\"%s\",\"stages\":%d,\"epi_smem\":%d,\"mainloop_smem\":null,\"kernel_smem\":null}\n",
                name, stages, epi);
  }
}

// SM120 dense, FlashInfer fp4_gemm_template_sm120.h style (C may be void or bf16).
template <int TM, int TN, int TK, class ElemA, class ElemB, int AlignA, int AlignB, class MainSched,
          class ElemC, bool SwapAB, bool StreamK>
void probe_dense_sm120(const char* name) {
  using Arch = cutlass::arch::Sm120;
  using Tile = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using Cluster = Shape<_1, _1, _1>;
  using D = cutlass::bfloat16_t;
  using LayoutC = std::conditional_t<SwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  constexpr int AlignC = 8;
  using Fusion = cutlass::epilogue::fusion::LinearCombination<D, float, ElemC, float>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, ElemC, LayoutC, AlignC, D, LayoutC, AlignC, cutlass::epilogue::TmaWarpSpecialized,
      Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElemA, cutlass::layout::RowMajor, AlignA, ElemB,
      cutlass::layout::ColumnMajor, AlignB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>,
      MainSched>::CollectiveOp;
  using Sched = std::conditional_t<StreamK, cutlass::gemm::StreamKScheduler, cutlass::gemm::StaticPersistentScheduler>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi, Sched>;
  report<Main, Epi, Kernel>(name);
}

// SM120 grouped MoE, TensorRT-LLM moe_gemm_tma_ws_launcher.inl style (C = D = bf16 pointer
// arrays, KernelScheduleAuto, GroupProblemShape, no tile scheduler).
template <int TM, int TN, int TK, class ElemA, class ElemB, int AlignA, int AlignB, bool SwapAB>
void probe_moe_sm120(const char* name) {
  using Arch = cutlass::arch::Sm120;
  using Tile = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using Cluster = Shape<_1, _1, _1>;
  using D = cutlass::bfloat16_t;
  using LayoutC = std::conditional_t<SwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, D, LayoutC*, 8, D, LayoutC*, 8, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElemA, cutlass::layout::RowMajor*, AlignA, ElemB,
      cutlass::layout::ColumnMajor*, AlignB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
  using Problem = cutlass::gemm::GroupProblemShape<Shape<int64_t, int64_t, int64_t>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Main, Epi, void, void>;
  report<Main, Epi, Kernel>(name);
}

// SM100 dense, FlashInfer fp4_gemm_template_sm100.h style (dynamic cluster, 1SM or 2SM MMA;
// TM is the per-CTA M, the MMA tile is TM*2 for 2SM; C = void as FlashInfer builds it, or bf16;
// D = bf16).
template <int TM, int TN, int TK, class ElemA, int Align, bool TwoSm, class MainSched1, class MainSched2,
          class ElemC = void>
void probe_dense_sm100(const char* name) {
  using Arch = cutlass::arch::Sm100;
  using MmaTile = Shape<Int<TM * (TwoSm ? 2 : 1)>, Int<TN>, Int<TK>>;
  using Cluster = Shape<int, int, _1>;
  using D = cutlass::bfloat16_t;
  using EpiSched = std::conditional_t<TwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm, cutlass::epilogue::TmaWarpSpecialized1Sm>;
  using MainSched = std::conditional_t<TwoSm, MainSched2, MainSched1>;
  using EpiTile = std::conditional_t<TM == 128 && TN == 256 && TK == 256, Shape<_128, _64>,
                                     cutlass::epilogue::collective::EpilogueTileAuto>;
  using Fusion = cutlass::epilogue::fusion::LinearCombination<D, float, ElemC, float>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, MmaTile, Cluster, EpiTile, float, float, ElemC,
      cutlass::layout::RowMajor, 8, D, cutlass::layout::RowMajor, 8, EpiSched, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElemA, cutlass::layout::RowMajor, Align, ElemA,
      cutlass::layout::ColumnMajor, Align, float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>,
      MainSched>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi,
                                                      cutlass::gemm::PersistentScheduler>;
  report<Main, Epi, Kernel>(name);
}

// SM100 grouped MoE, TensorRT-LLM moe_gemm_tma_ws_launcher.inl style for NVFP4 x NVFP4: dynamic
// cluster, pointer-array TMA epilogue (C void, D bf16), 128x64 epilogue subtile when N == 256.
template <int TM, int TN, int TK, bool TwoSm>
void probe_moe_sm100(const char* name) {
  using Arch = cutlass::arch::Sm100;
  using MmaTile = Shape<Int<TM * (TwoSm ? 2 : 1)>, Int<TN>, Int<TK>>;
  using Cluster = Shape<int, int, _1>;
  using D = cutlass::bfloat16_t;
  using El = cute::tuple<cutlass::float_e2m1_t, cutlass::float_ue4m3_t>;
  using EpiSched = std::conditional_t<TwoSm, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
                                      cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
  using MainSched = std::conditional_t<TwoSm, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmNvf4Sm100,
                                       cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>;
  using EpiTile = std::conditional_t<TN == 256, Shape<_128, _64>, cutlass::epilogue::collective::EpilogueTileAuto>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster, EpiTile, float, float, void,
      cutlass::layout::RowMajor*, 8, D, cutlass::layout::RowMajor*, 8, EpiSched>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, El, cutlass::layout::RowMajor*, 32, El,
      cutlass::layout::ColumnMajor*, 32, float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>,
      MainSched>::CollectiveOp;
  using Problem = cutlass::gemm::GroupProblemShape<Shape<int64_t, int64_t, int64_t>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Main, Epi, void, void>;
  report<Main, Epi, Kernel>(name);
}
