// W4A16 NVFP4 decode GEMM for small M: y[M, N] = x[M, K] (bf16) * W[N, K]^T (NVFP4, cuda layout).
// The weight is the A operand of mma.sync.m16n8k16 (TN tiles of 16 weight rows per CTA), the
// activations the B operand (8 rows of x per n8 tile, MT tiles). Warps split K (WK); each thread streams its own
// fragment words through a STAGES-deep cp.async ring that only it reads (no barrier in the loop);
// partial sums are reduced across warps through shared memory in a fixed order (deterministic).
// SPLITK > 1: grid.z CTAs split K; each stores its fp32 partial rows to ws [SPLITK][M][N], fences
// and bumps a counter per (M tile, N tile); the last to arrive sums the partials in split order
// (deterministic whatever arrives last), runs the epilogue and resets the counter: one launch, no
// memset, graph-capturable (moe_mma's scheme).
// Launched with programmatic dependent launch (pdl.py), a CTA waits for the previous kernel
// (pdl_wait) before it reads or writes anything, then lets the next kernel start.
// SWIGLU = 1 (vLLM's [gate; up] rows, y [M][N/2]): the CTA's tiles 0..TN/2-1 are gate rows, tiles
// TN/2..TN-1 the matching up rows N/2 further on; the epilogue writes silu(gate) * up in fp32.
// Config (MT, WK, STAGES, TN, SPLITK, SWIGLU), the layout's bit constants (ROT*/MASK*) and the
// format's scale decode (SCALE_MUL, SCALE_ADD, EPI_SCALE; SW = 16 for MXFP4, whose lanes t and t^1
// share one 32-k block and so one scale word, absent = 32 for NVFP4) come as -D macros.
// No headers: build.text prepends mma_common.cuh (the shared helpers); the same text compiles under
// NVRTC and nvcc, for sm_80 and newer.
#define NTHREADS (WK * 32)
#define PIPE_BYTES (STAGES * NTHREADS * 36 * TN)
#define RED_BYTES (WK * TN * MT * 4 * 32 * 4)
#define SMEM_BYTES (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES)
#ifndef SPLITK
#define SPLITK 1
#endif
#ifndef SWIGLU
#define SWIGLU 0
#endif
#ifndef SW
#define SW 32                 // scale words per row tile per k-pair (NVFP4: one per lane)
#endif
#if SW == 16
#define SLANE(l) ((l) >> 1)   // MXFP4: lanes t and t^1 read one scale word
#else
#define SLANE(l) (l)
#endif
#if SWIGLU
#define OUT_TN (TN / 2)       // output tiles per CTA: one per gate/up pair
#else
#define OUT_TN TN
#endif
#if SPLITK > 1
// another CTA's partial: from L2 (L1 is not coherent across SMs)
static __device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
#endif

// one k-pair of every row tile into ring stage `st` (mma_common.cuh's layout): TN x 2 x 16 B words,
// TN x 4 B scales. SWIGLU: the up tiles (u >= TN/2) lie `wgap`/`sgap` further on (N/2 rows past
// their gate tiles)
static __device__ __forceinline__ void issue(unsigned char* wslot0, unsigned char* sslot0, int st, const uint4* w,
                                             const u32* s, size_t wtile, size_t stile, size_t wgap, size_t sgap) {
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const size_t wo = u * wtile + (SWIGLU && u >= TN / 2 ? wgap : 0);
    const size_t so = u * stile + (SWIGLU && u >= TN / 2 ? sgap : 0);
    cp16(wslot0 + RING_W(st, u, 0), w + wo);
    cp16(wslot0 + RING_W(st, u, 1), w + wo + 32);
    cp4(sslot0 + RING_S(st, u), s + so);
  }
}

// one k-pair of the main loop: (XPRE) the next k-pair's x into `xn` first, then wait for this
// k-pair's ring stage, read it, refill the ring, and multiply with `xc`
static __device__ __forceinline__ void kstep(int i, int kpairs, unsigned char* wslot0, unsigned char* sslot0,
                                             int& rslot, int& wslot, int& issued, const uint4*& wnext, const u32*& snext,
                                             size_t wtile, size_t stile, size_t wgap, size_t sgap, const u16* (&xrow)[MT],
                                             const uint4 (&xc)[MT][4], uint4 (&xn)[MT][4], float (&acc)[TN][MT][4]) {
  if (XPRE && i + 1 < kpairs) load_x(xrow, xn);
  wait_pending<STAGES - 2>();
  uint4 wv2[TN][2];
  u32 sv[TN];
  read_slot(wslot0, sslot0, rslot, wv2, sv);
  rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
  if (issued < kpairs) {
    issue(wslot0, sslot0, wslot, wnext, snext, wtile, stile, wgap, sgap);
    wnext += 64; snext += SW; ++issued;
    wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
  }
  commit();
  mma_kpair(wv2, sv, xc, acc);
}

// wq: fragment words [N/16][K/64][32][4]; sq: scale words [N/16][K/128][SW]; x [M][K]; y [M][N]
// (SWIGLU: [M][N/2]); ws [SPLITK][M][N] fp32 and locks [gridDim.y][gridDim.x] (zero between launches)
// are read only when SPLITK > 1
extern "C" __global__ void __launch_bounds__(NTHREADS)
w4a16_mma(const uint4* __restrict__ wq, const u32* __restrict__ sq, const u16* __restrict__ x,
          u16* __restrict__ y, const float* __restrict__ gscale, int M, int N, int K,
          float* __restrict__ ws, int* __restrict__ locks) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  // ring: mma_common.cuh's layout (fragment words, then scales), each thread reading only its own bytes
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x, m0 = blockIdx.y * (8 * MT);
  const int kpairs = K / 128 / SPLITK / WK;        // k-pairs this warp reduces
#if SPLITK > 1
  const int kp0 = (int)blockIdx.z * (K / 128 / SPLITK) + warp * kpairs;
#else
  const int kp0 = warp * kpairs;
#endif
  // global sources advance by one k-pair per step: 64 words of 16 B, 32 scale words, 128 x elements
  // tile u of this CTA is row tile nt*TN + u (SWIGLU: gate tile nt*TN/2 + u, its up tile N/32 tiles
  // on); a tile's words are (K/64)*32 uint4 further on
  const size_t wtile = (size_t)(K / 64) * 32, stile = (size_t)(K / 128) * SW;
#if SWIGLU
  const int tile0 = nt * (TN / 2);
  const size_t wgap = (size_t)(N / 32 - TN / 2) * wtile, sgap = (size_t)(N / 32 - TN / 2) * stile;
#else
  const int tile0 = nt * TN;
  const size_t wgap = 0, sgap = 0;
#endif
  const uint4* wsrc = wq + (size_t)nt * (TN / (1 + SWIGLU)) * wtile + 2 * kp0 * 32 + lane;
  const u32* ssrc = sq + (size_t)nt * (TN / (1 + SWIGLU)) * stile + kp0 * SW + SLANE(lane);
  const u16* xrow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    // a row past M feeds only output columns that are never stored: read row M-1 instead of 0s
    const int m = min(m0 + 8 * j + g, M - 1);
    xrow[j] = x + (size_t)m * K + kp0 * 128 + 16 * t;
  }
  pdl_wait();                  // every read and write comes after it
  pdl_release();
  float acc[TN][MT][4];
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;

  // this thread's column of the ring: its own bytes only, so no barrier guards reuse
  unsigned char* const wslot0 = smem + tid * 16;
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  const uint4* wnext = wsrc;
  const u32* snext = ssrc;
  int issued = 0, wslot = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (issued < kpairs) {
      issue(wslot0, sslot0, i, wnext, snext, wtile, stile, wgap, sgap);
      wnext += 64; snext += SW; ++issued;
    }
    commit();
  }
  int rslot = 0;
  wslot = STAGES - 1;
#if XPRE
  // two steps per trip, the x registers swapping roles: no copies between the sets
  uint4 xa[MT][4], xb[MT][4];                        // [tile][kgroup*2 + half]
  load_x(xrow, xa);
#pragma unroll 2
  for (int i = 0; i < kpairs; i += 2) {
    kstep(i, kpairs, wslot0, sslot0, rslot, wslot, issued, wnext, snext, wtile, stile, wgap, sgap, xrow, xa, xb, acc);
    if (i + 1 < kpairs)
      kstep(i + 1, kpairs, wslot0, sslot0, rslot, wslot, issued, wnext, snext, wtile, stile, wgap, sgap, xrow, xb, xa, acc);
  }
#else
#pragma unroll 4
  for (int i = 0; i < kpairs; ++i) {
    uint4 xv[MT][4];
    load_x(xrow, xv);
    kstep(i, kpairs, wslot0, sslot0, rslot, wslot, issued, wnext, snext, wtile, stile, wgap, sgap, xrow, xv, xv, acc);
  }
#endif
  wait_pending<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);        // [WK][TN*MT*4][32]
#define RED(w, u, j, c) red[((((w) * TN + (u)) * MT + (j)) * 4 + (c)) * 32 + lane]
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) RED(warp, u, j, c) = acc[u][j][c];
  __syncthreads();
  if (warp != 0) return;
  const float alpha = gscale[0] * EPI_SCALE;
#if SPLITK == 1 && !SWIGLU
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const int n = (nt * TN + u) * 16 + g;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float v = 0.f;
        for (int w = 0; w < WK; ++w) v += RED(w, u, j, c);
        const int m = m0 + 8 * j + 2 * t + (c & 1);
        if (m < M) y[(size_t)m * N + n + (c >> 1) * 8] = to_bf16(v * alpha);
      }
    }
  }
#else
  // weight row of tile u's column slot c (its lane's rows g and g + 8)
#define WROW(u, c) ((tile0 + (u) + (SWIGLU && (u) >= TN / 2 ? N / 32 - TN / 2 : 0)) * 16 + g + ((c) >> 1) * 8)
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float v = 0.f;
        for (int w = 0; w < WK; ++w) v += RED(w, u, j, c);     // warp order: deterministic
        acc[u][j][c] = v;
      }
#if SPLITK > 1
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + 8 * j + 2 * t + (c & 1);
        if (m < M) ws[((size_t)blockIdx.z * M + m) * N + WROW(u, c)] = acc[u][j][c];
      }
  __threadfence();                                   // this split's partials before its arrival
  __syncwarp();
  int old = 0;
  int* const lock = locks + (size_t)blockIdx.y * gridDim.x + nt;
  if (lane == 0) old = atomicAdd(lock, 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != SPLITK - 1) return;
  __threadfence();                                   // the other splits' partials are visible (L2)
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + 8 * j + 2 * t + (c & 1);
        float v = 0.f;
        if (m < M)
          for (int s = 0; s < SPLITK; ++s)            // split order: deterministic
            v += ld_cg(ws + ((size_t)s * M + m) * N + WROW(u, c));
        acc[u][j][c] = v;
      }
  if (lane == 0) atomicExch(lock, 0);                // ready for the next launch
#endif
  const int nout = SWIGLU ? N / 2 : N;
#pragma unroll
  for (int u = 0; u < OUT_TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + 8 * j + 2 * t + (c & 1);
        if (m >= M) continue;
        float v = acc[u][j][c] * alpha;
#if SWIGLU
        const float up = acc[u + TN / 2][j][c] * alpha;
        v = v / (1.f + __expf(-v)) * up;
#endif
        y[(size_t)m * nout + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8] = to_bf16(v);
      }
#undef WROW
#endif
}
