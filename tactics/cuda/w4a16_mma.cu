// W4A16 NVFP4 decode GEMM for small M: y[M, N] = x[M, K] (bf16) * W[N, K]^T (NVFP4, cuda layout).
// The weight is the A operand of mma.sync.m16n8k16 (TN tiles of 16 weight rows per CTA), the
// activations the B operand (8 rows of x per n8 tile, MT tiles). Warps split K (WK); each thread streams its own
// fragment words through a STAGES-deep cp.async ring that only it reads (no barrier in the loop);
// partial sums are reduced across warps through shared memory in a fixed order (deterministic).
// Config (MT, WK, STAGES, TN), the layout's bit constants (ROT*/MASK*) and the NVFP4 scale decode
// (SCALE_MUL, SCALE_ADD) come as -D macros.
// No headers: build.text prepends mma_common.cuh (the shared helpers); the same text compiles under
// NVRTC and nvcc, for sm_80 and newer.
#define NTHREADS (WK * 32)
#define PIPE_BYTES (STAGES * NTHREADS * 36 * TN)
#define RED_BYTES (WK * TN * MT * 4 * 32 * 4)
#define SMEM_BYTES (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES)

// one k-pair of every row tile into this thread's ring slot: TN x 2 x 16 B words, TN x 4 B scales
static __device__ __forceinline__ void issue(unsigned char* wdst, unsigned char* sdst, const uint4* w,
                                             const u32* s, size_t wtile, size_t stile) {
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    cp16(wdst + u * 32, w + u * wtile);
    cp16(wdst + u * 32 + 16, w + u * wtile + 32);
    cp4(sdst + u * 4, s + u * stile);
  }
}

// wq: fragment words [N/16][K/64][32][4]; sq: scale words [N/16][K/128][32]; x [M][K]; y [M][N]
extern "C" __global__ void __launch_bounds__(NTHREADS)
w4a16_mma(const uint4* __restrict__ wq, const u32* __restrict__ sq, const u16* __restrict__ x,
          u16* __restrict__ y, const float* __restrict__ gscale, int M, int N, int K) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  // ring: [STAGES][NTHREADS] x TN*32 B of fragment words, then [STAGES][NTHREADS] x TN*4 B of scales
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x, m0 = blockIdx.y * (8 * MT);
  const int kpairs = K / 128 / WK;                 // k-pairs this warp reduces
  const int kp0 = warp * kpairs;
  // global sources advance by one k-pair per step: 64 words of 16 B, 32 scale words, 128 x elements
  // tile u of this CTA is row tile nt*TN + u; its words are (K/64)*32 uint4 further on
  const size_t wtile = (size_t)(K / 64) * 32, stile = (size_t)(K / 128) * 32;
  const uint4* wsrc = wq + (size_t)nt * TN * wtile + 2 * kp0 * 32 + lane;
  const u32* ssrc = sq + (size_t)nt * TN * stile + kp0 * 32 + lane;
  const u16* xrow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    // a row past M feeds only output columns that are never stored: read row M-1 instead of 0s
    const int m = min(m0 + 8 * j + g, M - 1);
    xrow[j] = x + (size_t)m * K + kp0 * 128 + 16 * t;
  }
  float acc[TN][MT][4];
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;

  // this thread's slots in the ring: its own bytes only, so no barrier guards reuse
  unsigned char* const wslot0 = smem + tid * 32 * TN;
  unsigned char* const sslot0 = smem + STAGES * NTHREADS * 32 * TN + tid * 4 * TN;
  const uint4* wnext = wsrc;
  const u32* snext = ssrc;
  int issued = 0, wslot = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (issued < kpairs) {
      issue(wslot0 + i * NTHREADS * 32 * TN, sslot0 + i * NTHREADS * 4 * TN, wnext, snext, wtile, stile);
      wnext += 64; snext += 32; ++issued;
    }
    commit();
  }
  int rslot = 0;
  wslot = STAGES - 1;
#pragma unroll 4
  for (int i = 0; i < kpairs; ++i) {
    uint4 xv[MT][4];                                 // [tile][kgroup*2 + half]
    load_x(xrow, xv);
    wait_pending<STAGES - 2>();
    uint4 wv2[TN][2];
    u32 sv[TN];
    read_slot(wslot0, sslot0, rslot, wv2, sv);
    rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
    if (issued < kpairs) {
      issue(wslot0 + wslot * NTHREADS * 32 * TN, sslot0 + wslot * NTHREADS * 4 * TN, wnext, snext, wtile, stile);
      wnext += 64; snext += 32; ++issued;
      wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
    }
    commit();
    mma_kpair(wv2, sv, xv, acc);
  }
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
}
