// Token-major grouped-MoE w2 with the top_k sum (the `reduce` problem variant), for decode: CTA
// (token, N tile) runs its token's routed slots one after another through one cp.async ring and
// sums their routing-weighted rows in registers. moe_mma's REDUCE writes every pair's fp32 row to
// global memory and has the last of a token's CTAs (a counter per token and tile) add them; at
// M = 1 that epilogue was 2.6 of w2's 8.4 µs on the H200 (docs/moe-decode.md part 8), and each of
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
// layout's constants come as -D macros; build.text prepends mma_common.cuh and moe_common.cuh.
#define NTHREADS (WK * 32)
#define MAXK 32               // slots per token (top_k): one lane of warp 0 each
#define PIPE_BYTES (STAGES * NTHREADS * 36 * TN)
#define RED_BYTES (WK * TN * 2 * 32 * 4)
#define SMEM_BYTES (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES)
#if SW == 16
#define SLANE(l) ((l) >> 1)   // MXFP4: lanes t and t^1 share one 32-k block, one scale word
#else
#define SLANE(l) (l)
#endif
#if MT != 1
#error "moe_tok runs one x row per CTA: MT must be 1"
#endif

// the ring's read pointers at slot s's expert: this warp's first k-pair of every row tile
static __device__ __forceinline__ void slot_ptrs(const uint4* wq, const u32* sq, int e, int N, int K, int nt, int kp0,
                                                 int lane, const uint4* (&wp)[TN], const u32* (&sp)[TN]) {
  const size_t wtile = (size_t)(K / 64) * 32, stile = (size_t)(K / 128) * SW;
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const size_t tile = (size_t)e * (N / 16) + nt * TN + u;
    wp[u] = wq + tile * wtile + 2 * kp0 * 32 + lane;
    sp[u] = sq + tile * stile + kp0 * SW + SLANE(lane);
  }
}

// the ring's issue side: the next k-pair of the cursor (is, ik) into ring stage `st`, then the cursor on
// (at a slot's end the pointers move to the next slot's expert)
static __device__ __forceinline__ void issue_next(unsigned char* wslot0, unsigned char* sslot0, int st, int& is,
                                                  int& ik, int kpairs, int n, const int* slot_e, const uint4* wq,
                                                  const u32* sq, int N, int K, int nt, int kp0, int lane,
                                                  const uint4* (&wp)[TN], const u32* (&sp)[TN]) {
  issue(wslot0, sslot0, st, wp, sp);
#pragma unroll
  for (int u = 0; u < TN; ++u) { wp[u] += 64; sp[u] += SW; }
  if (++ik == kpairs) {
    ik = 0;
    if (++is < n) slot_ptrs(wq, sq, slot_e[is], N, K, nt, kp0, lane, wp, sp);
  }
}

// x of the read cursor's k-pair: one row per slot, lanes of a group share the address
static __device__ __forceinline__ void load_xk(const u16* xk, const int* slot_x, int s, int k, int K,
                                               uint4 (&xv)[1][4]) {
  const u16* xr[1] = {xk + (size_t)slot_x[s] * K + k * 128};
  load_x(xr, xv);
}

// one k-pair of the main loop: the next k-pair's x into `xn` first, then wait for this k-pair's ring
// stage, read it, refill the ring, multiply with `xc`; at the slot's last k-pair its partial, times
// the slot's scale, goes into `sum` (slot order)
static __device__ __forceinline__ void tstep(int i, int total, int kpairs, int n, const u16* xk, int K,
                                             const int* slot_x, const int* slot_e, const float* slot_a,
                                             const uint4* wq, const u32* sq, int N, int nt, int kp0, int lane,
                                             unsigned char* wslot0, unsigned char* sslot0, int& rslot, int& wslot,
                                             int& issued, int& is, int& ik, int& rs, int& rk, const uint4* (&wp)[TN],
                                             const u32* (&sp)[TN], const uint4 (&xc)[1][4], uint4 (&xn)[1][4],
                                             float (&acc)[TN][1][4], float (&sum)[TN][4]) {
  if (i + 1 < total) {
    const bool last = rk + 1 == kpairs;
    load_xk(xk, slot_x, last ? rs + 1 : rs, last ? 0 : rk + 1, K, xn);
  }
  wait_pending<STAGES - 2>();
  uint4 wv2[TN][2];
  u32 sv[TN];
  read_slot(wslot0, sslot0, rslot, wv2, sv);
  rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
  if (issued < total) {
    issue_next(wslot0, sslot0, wslot, is, ik, kpairs, n, slot_e, wq, sq, N, K, nt, kp0, lane, wp, sp);
    ++issued;
    wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
  }
  commit();
  mma_kpair(wv2, sv, xc, acc);
  if (++rk == kpairs) {
    const float a = slot_a[rs];
#pragma unroll
    for (int u = 0; u < TN; ++u)
#pragma unroll
      for (int c = 0; c < 4; ++c) { sum[u][c] += acc[u][0][c] * a; acc[u][0][c] = 0.f; }
    rk = 0;
    ++rs;
  }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
moe_tok(const uint4* __restrict__ wq, const u32* __restrict__ sq, const u16* __restrict__ x,
        u16* __restrict__ y, const float* __restrict__ gscale, const void* __restrict__ ids,
        const float* __restrict__ tw, int* __restrict__ bad, int M, int N, int K, int top_k, int n_exp, int ids64,
        int x_pair, int routed, int gs_stride, int shared_e, int ids_cols) {
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
    const int p = tok * top_k + lane;
    const long long e = lane < top_k ? pair_id(ids, ids64, p, top_k, ids_cols, shared_e) : -1;
    const bool hit = e >= 0 && e < n_exp;
    const u32 m = __ballot_sync(0xffffffffu, hit);
    // top_k > MAXK cannot be held (the launcher refuses it): every row NaN rather than slots dropped
    const bool any_bad = __any_sync(0xffffffffu, e < -1 || e >= n_exp) || top_k > MAXK;
    if (hit) {
      const int pos = __popc(m & ((1u << lane) - 1u));
      slot_x[pos] = x_pair ? p : tok;
      slot_e[pos] = (int)e;
      slot_a[pos] = gscale[(size_t)e * gs_stride] * EPI_SCALE *
                    (routed ? pair_weight(tw, p, top_k, ids_cols, shared_e) : 1.f);
    }
    if (lane == 0) n_s = any_bad ? -1 : __popc(m);
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
  const uint4* wp[TN];
  const u32* sp[TN];
  if (n > 0) slot_ptrs(wq, sq, slot_e[0], N, K, nt, kp0, lane, wp, sp);
  unsigned char* const wslot0 = smem + tid * 16;  // this thread's column of the ring
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  // prologue: the first STAGES - 1 k-pairs; (is, ik) is the issue cursor (slot, k-pair in the slot)
  int issued = 0, is = 0, ik = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (issued < total) {
      issue_next(wslot0, sslot0, i, is, ik, kpairs, n, slot_e, wq, sq, N, K, nt, kp0, lane, wp, sp);
      ++issued;
    }
    commit();
  }
  float acc[TN][1][4], sum[TN][4];
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[u][0][c] = sum[u][c] = 0.f;
  const u16* const xk = x + (size_t)(kp0 * 128 + 16 * t);
  int rs = 0, rk = 0, rslot = 0, wslot = STAGES - 1;   // (rs, rk): the read cursor
  // x one k-pair ahead (as moe_mma's XPRE at MT = 1); two steps per trip, the sets swapping roles
  uint4 xa[1][4], xb[1][4];
  if (total > 0) load_xk(xk, slot_x, 0, 0, K, xa);
  for (int i = 0; i < total; i += 2) {
    tstep(i, total, kpairs, n, xk, K, slot_x, slot_e, slot_a, wq, sq, N, nt, kp0, lane, wslot0, sslot0, rslot, wslot,
          issued, is, ik, rs, rk, wp, sp, xa, xb, acc, sum);
    if (i + 1 < total)
      tstep(i + 1, total, kpairs, n, xk, K, slot_x, slot_e, slot_a, wq, sq, N, nt, kp0, lane, wslot0, sslot0, rslot,
            wslot, issued, is, ik, rs, rk, wp, sp, xb, xa, acc, sum);
  }
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
    u16* const row = y + (size_t)tok * N + (nt * TN + u) * 16 + g;
    row[0] = to_bf16(sum[u][0]);                   // weight row g of the tile
    row[8] = to_bf16(sum[u][2]);                   // and row g + 8
  }
}
