// The token-major slot cursor of the grouped kernels that run a token's routed slots one after another
// through one ring (moe_tok.cu, moe_layer.cu's w2 role; build.text joins it after moe_common.cuh): the
// token's slots gathered (token_slots), the weight source over them (SlotSrc) and the x reader that
// sums each slot's partial in registers (SlotX).
#ifndef MAXK
#define MAXK 32               // slots per token (top_k): one lane of warp 0 each
#endif
// another CTA's 16 bytes, from L2 (L1 is not coherent across SMs)
static __device__ __forceinline__ uint4 ldcg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

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

// the ring's weight source over the token's slots: the cursor (is, ik) is the issue side's (slot,
// k-pair in the slot); at a slot's end the pointers move to the next slot's expert
struct SlotSrc {
  TilePtrs p;
  int is, ik, kpairs, n, N, K, nt, kp0, lane;
  const int* slot_e;
  const uint4* wq;
  const u32* sq;
  __device__ __forceinline__ const uint4* w(int u) const { return p.wp[u]; }
  __device__ __forceinline__ const u32* s(int u) const { return p.sp[u]; }
  __device__ __forceinline__ void next() {
    p.next();
    if (++ik == kpairs) {
      ik = 0;
      if (++is < n) slot_ptrs(wq, sq, slot_e[is], N, K, nt, kp0, lane, p.wp, p.sp);
    }
  }
};

// x of the read cursor (rs, rk: slot, k-pair in the slot), one row per slot (lanes of a group share the
// address); at the slot's last k-pair its partial, times the slot's scale, goes into `sum` (slot order).
// CG: the rows are another CTA's of the same launch (moe_layer's h), read with ld.global.cg
template <bool CG = false>
struct SlotX {
  const u16* xk;
  const int* slot_x;
  const float* slot_a;
  int K, kpairs, rs, rk;
  float (&sum)[TN][4];
  __device__ __forceinline__ void load(int s, int k, uint4 (&xv)[1][4]) const {
    const u16* xr[1] = {xk + (size_t)slot_x[s] * K + k * 128};
    if (CG) {                                      // rows another CTA of this launch wrote: from L2
#pragma unroll
      for (int q = 0; q < 4; ++q) xv[0][q] = ldcg16(xr[0] + (q >> 1) * 64 + (q & 1) * 8);
    } else {
      load_x(xr, xv);
    }
  }
  __device__ __forceinline__ void first(uint4 (&xv)[1][4]) { load(0, 0, xv); }
  __device__ __forceinline__ void ahead(int i, int total, uint4 (&xn)[1][4]) {
    if (i + 1 < total) {
      const bool last = rk + 1 == kpairs;
      load(last ? rs + 1 : rs, last ? 0 : rk + 1, xn);
    }
  }
  __device__ __forceinline__ void step_done(float (&acc)[TN][1][4]) {
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
};

// warp 0, lane `lane`: the token's routed slots (x row, expert, scale) into slot_x / slot_e / slot_a in
// slot order; returns their count, or -1 for an id outside [-1, E) (or top_k > MAXK)
static __device__ __forceinline__ int token_slots(int tok, int lane, const void* ids, int ids64, int top_k,
                                                  int ids_cols, int shared_e, int n_exp, int x_pair, int routed,
                                                  const float* gscale, int gs_stride, const float* tw, int* slot_x,
                                                  int* slot_e, float* slot_a) {
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
  return any_bad ? -1 : __popc(m);
}
