// Token-major grouped-MoE w2 with the top_k sum (the `reduce` problem variant), for decode: CTA
// (token, N tile) runs its token's routed slots one after another through one cp.async ring and
// sums their routing-weighted rows in registers. moe_mma's REDUCE writes every pair's fp32 row to
// global memory and has the last of a token's CTAs (a counter per token and tile) add them; at
// M = 1 that epilogue was 2.6 of w2's 8.4 µs on the H200, and each of
// its CTAs streams only K / 128 k-pairs (2 at GLM-5 TP8) through its ring. Here a CTA streams
// top_k times as many and writes one bf16 row: no scratch, no counters, no second pass.
// The weight is the MMA's A operand (16 rows of N per tile), x its B operand: all 8 columns carry
// the same x row (lanes of a group read one address), column 0 is stored. Each weight byte is
// read once per token that routes to its expert, so this wins only while few tokens share an
// expert (decode); the search times it per M bucket beside moe_mma.
// Order (deterministic, independent of the batch): each warp sums its K range of every slot in
// slot order, each slot's partial times its scale (global scale x EPI_SCALE x routing weight);
// then the warps in warp order. Ids: -1 a slot that adds nothing, an id outside [-1, E) makes the
// token's row NaN and sets the sticky `bad` word (as moe_mma's reduce, whose NaN pair row sums to
// NaN). A shared slot (shared_e >= 0) as moe_mma's (moe_common.cuh).
// Config (WK, STAGES, TN; MT = 1), the format's (SW, SCALE_MUL, SCALE_ADD, EPI_SCALE) and the
// layout's constants come as -D macros; build.text joins the shared parts, moe_common.cuh and
// tok_slots.cuh (the slot cursor) before this kernel. The parameters are args.py's declaration.
#define MAXK 32               // slots per token (top_k): one lane of warp 0 each
#if MT != 1
#error "moe_tok runs one x row per CTA: MT must be 1"
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS) moe_tok(MOE_TOK_PARAMS) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  __shared__ int slot_x[MAXK];                    // the x row of each routed slot, in slot order
  __shared__ int slot_e[MAXK];                    // its expert
  __shared__ float slot_a[MAXK];                  // its scale
  __shared__ int n_s;                             // routed slots; -1: an id outside [-1, E)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tok = blockIdx.x, nt = blockIdx.y;
  pdl_wait();                                     // every read of inputs and every write after it
  pdl_release();
  if (tok >= M) return;                           // the launcher's grid is (M, N tiles): never, unless misused
  if (warp == 0) {                                // the token's slots, one lane each (top_k <= MAXK)
    const int n = token_slots(tok, lane, ids, ids64, top_k, ids_cols, shared_e, n_exp, x_pair, routed, gscale,
                              gs_stride, tw, slot_x, slot_e, slot_a);
    if (lane == 0) n_s = n;
  }
  __syncthreads();
  const int n = n_s;
  if (n < 0) {                                    // a bad id: the token's row is NaN, the word set once
    if (nt == 0 && tid == 0) atomicExch(bad, 1);
    for (int c = tid; c < 16 * TN; c += NTHREADS) y[(size_t)tok * N + nt * 16 * TN + c] = (u16)0x7FC0;
    return;
  }
  const int kpairs = K / 128 / WK;                // k-pairs of each slot this warp reduces
  const int kp0 = warp * kpairs;
  const int total = n * kpairs;                   // the warp's k-pairs over all slots
  SlotSrc src;
  src.is = 0;
  src.ik = 0;
  src.kpairs = kpairs;
  src.n = n;
  src.N = N;
  src.K = K;
  src.nt = nt;
  src.kp0 = kp0;
  src.lane = lane;
  src.slot_e = slot_e;
  src.wq = wq;
  src.sq = sq;
  if (n > 0) slot_ptrs(wq, sq, slot_e[0], N, K, nt, kp0, lane, src.p.wp, src.p.sp);
  unsigned char* const wslot0 = smem + tid * 16;  // this thread's column of the ring
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  int issued = prologue(wslot0, sslot0, src, total);
  float acc[TN][1][4], sum[TN][4];
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[u][0][c] = sum[u][c] = 0.f;
  SlotX<> xs = {x + (size_t)(kp0 * 128 + 16 * t), slot_x, slot_a, K, kpairs, 0, 0, sum};
  int rslot = 0, wslot = STAGES - 1;
  // x one k-pair ahead (main_loop's XPRE at MT = 1), the token's slots one after another
  if (total > 0) main_loop(total, wslot0, sslot0, rslot, wslot, issued, src, xs, acc);
  wait_pending<0>();
#if WK > 1
  __syncthreads();                                 // the ring is free: the warps' column-0 sums, [WK][TN][2][32]
  float* const wred = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    wred[((warp * TN + u) * 2 + 0) * 32 + lane] = sum[u][0];
    wred[((warp * TN + u) * 2 + 1) * 32 + lane] = sum[u][2];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    float v0 = 0.f, v2 = 0.f;
    for (int w = 0; w < WK; ++w) {                 // warp order: deterministic
      v0 += wred[((w * TN + u) * 2 + 0) * 32 + lane];
      v2 += wred[((w * TN + u) * 2 + 1) * 32 + lane];
    }
    sum[u][0] = v0;
    sum[u][2] = v2;
  }
#endif
  if (t != 0) return;                              // column 0 (x's row): lanes t = 0, values c = 0 and 2
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const size_t row = (size_t)tok * N + (nt * TN + u) * 16 + g;
    store_bf16(y, row, sum[u][0]);                 // weight row g of the tile
    store_bf16(y, row + 8, sum[u][2]);             // and row g + 8
  }
}
