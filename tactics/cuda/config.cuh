// Configuration macros every cuda kernel shares (build.text puts this file first). The config (MT, WK,
// STAGES, TN; the grouped kernels' SPLITK, SWIGLU, REDUCE, NW), the layout's bit constants (ROT*/MASK*)
// and the format's scale decode (SW, SCALE_MUL, SCALE_ADD, EPI_SCALE) come as -D macros; an absent one
// takes the default below.
#ifndef SPLITK
#define SPLITK 1              // CTAs splitting K
#endif
#ifndef SWIGLU
#define SWIGLU 0              // vLLM's [gate; up] rows: half the CTA's tiles gate, half up
#endif
#ifndef SW
#define SW 32                 // scale words per row tile per k-pair (NVFP4: one per lane)
#endif
#define NTHREADS (WK * 32)
// the cp.async ring (ring.cuh) and the cross-warp reduction (reduce.cuh) share one static array
#define PIPE_BYTES (STAGES * NTHREADS * 36 * TN)
#define RED_BYTES (WK * TN * MT * 4 * 32 * 4)
#define SMEM_BYTES (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES)
#if SW == 16
#define SLANE(l) ((l) >> 1)   // MXFP4: lanes t and t^1 share one 32-k block, one scale word
#else
#define SLANE(l) (l)
#endif
#if SWIGLU
#define OUT_TN (TN / 2)       // output tiles per CTA: tiles 0..TN/2-1 gate rows, TN/2..TN-1 the matching up rows
#else
#define OUT_TN TN
#endif
// every value (u, j, c) of U row tiles x MT n8 tiles x 4 accumulator values, fully unrolled
#define FOR_VALUES(U, u, j, c)                                                                   \
  _Pragma("unroll") for (int u = 0; u < (U); ++u)                                                 \
  _Pragma("unroll") for (int j = 0; j < MT; ++j)                                                 \
  _Pragma("unroll") for (int c = 0; c < 4; ++c)
