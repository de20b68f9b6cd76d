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
// No headers: build.text joins the shared parts (build.SOURCES) before this route and store; the same
// text compiles under NVRTC and nvcc, for sm_80 and newer. The parameters are args.py's declaration.
// the dense rows: row m of x and y for n8 tile j's value c, stored while m < M; weight rows of tile u
// (SWIGLU: gate tile tile0 + u, its up tile N/32 tiles on)
struct DenseRows {
  int m0, t, g, M;
  size_t rows;
  int tile0, N;
  __device__ __forceinline__ int row(int j, int c) const { return m0 + 8 * j + 2 * t + (c & 1); }
  __device__ __forceinline__ bool has(int m) const { return m < M; }
  __device__ __forceinline__ size_t at(size_t base, int u, int c) const {
    return base + ((tile0 + u + (SWIGLU && u >= TN / 2 ? N / 32 - TN / 2 : 0)) * 16 + g + ((c) >> 1) * 8);
  }
};

// wq: fragment words [N/16][K/64][32][4]; sq: scale words [N/16][K/128][SW]; x [M][K]; y [M][N]
// (SWIGLU: [M][N/2]); ws [SPLITK][M][N] fp32 and locks [gridDim.y][gridDim.x] (zero between launches)
// are read only when SPLITK > 1
extern "C" __global__ void __launch_bounds__(NTHREADS) w4a16_mma(W4A16_MMA_PARAMS) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x, m0 = blockIdx.y * (8 * MT);
  const int kpairs = K / 128 / SPLITK / WK;        // k-pairs this warp reduces
#if SPLITK > 1
  const int kp0 = (int)blockIdx.z * (K / 128 / SPLITK) + warp * kpairs;
#else
  const int kp0 = warp * kpairs;
#endif
  // global sources advance by one k-pair per step: 64 words of 16 B, 32 scale words, 128 x elements;
  // tile u of this CTA is row tile nt*TN + u (SWIGLU: gate tile nt*TN/2 + u, its up tile N/32 tiles
  // on); a tile's words are (K/64)*32 uint4 further on
  TileBase src;
  src.wtile = (size_t)(K / 64) * 32;
  src.stile = (size_t)(K / 128) * SW;
#if SWIGLU
  const int tile0 = nt * (TN / 2);
  src.wgap = (size_t)(N / 32 - TN / 2) * src.wtile;
  src.sgap = (size_t)(N / 32 - TN / 2) * src.stile;
#else
  const int tile0 = nt * TN;
  src.wgap = 0;
  src.sgap = 0;
#endif
  src.wb = wq + (size_t)nt * (TN / (1 + SWIGLU)) * src.wtile + 2 * kp0 * 32 + lane;
  src.sb = sq + (size_t)nt * (TN / (1 + SWIGLU)) * src.stile + kp0 * SW + SLANE(lane);
  XRows xs;
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    // a row past M feeds only output columns that are never stored: read row M-1 instead of 0s
    const int m = min(m0 + 8 * j + g, M - 1);
    xs.row[j] = x + (size_t)m * K + kp0 * 128 + 16 * t;
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
  int issued = 0, wslot = 0;
  issued = prologue(wslot0, sslot0, src, kpairs);
  int rslot = 0;
  wslot = STAGES - 1;
  main_loop(kpairs, wslot0, sslot0, rslot, wslot, issued, src, xs, acc);
  const float* red = warps_publish(smem, warp, lane, acc);
  if (warp != 0) return;
  const float alpha = gscale[0] * EPI_SCALE;
  const DenseRows R = {m0, t, g, M, (size_t)M, tile0, N};
#if SPLITK == 1 && !SWIGLU
  // the store: each value summed over the warps and stored at once
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const int n = (nt * TN + u) * 16 + g;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float v = warps_sum(red, lane, u, j, c);
        const int m = R.row(j, c);
        if (R.has(m)) store_bf16(y, (size_t)m * N + n + (c >> 1) * 8, v * alpha);
      }
    }
  }
#else
  warps_total(red, lane, acc);
#if SPLITK > 1
  int* const lock = locks + (size_t)blockIdx.y * gridDim.x + nt;
  if (!splitk_arrive(ws, lock, (size_t)blockIdx.z, N, lane, R, acc)) return;
  splitk_sum(ws, lock, N, lane, R, acc);
#endif
  const int nout = SWIGLU ? N / 2 : N;
  epilogue(acc, alpha, R, [&](int m, int u, int c, float v) {
    store_bf16(y, (size_t)m * nout + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8, v);
  });
#endif
}
