// The main loop every cuda kernel runs (build.text joins it after ring.cuh): one k-pair's decode and
// MMAs (`mma_kpair`), one step of the loop (`kstep`: x, the ring's wait, read and refill, the MMAs) and
// the two-step loop (`main_loop`).
// XPRE: x is loaded one k-pair ahead (a second register set), so its L2 round trip overlaps the
// current k-pair's MMAs instead of preceding them (ncu on the H200: the x load and the MMA waiting on
// it were 31 % of the M=1 stalls). MT = 1 only (the decode tile, where the bench measured it): the
// second set costs 16 * MT registers, and at MT = 2 ptxas took 68 more (96 -> 164 on sm_90).
#ifndef XPRE
#define XPRE (MT == 1)
#endif
// x: this thread's 4 x 16 B of activations per n8 tile (k-groups 0/1, halves 0/1), then one k-pair on
static __device__ __forceinline__ void load_x(const u16* (&xrow)[MT], uint4 (&xv)[MT][4]) {
#pragma unroll
  for (int j = 0; j < MT; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) xv[j][q] = ldg16(xrow[j] + (q >> 1) * 64 + (q & 1) * 8);
    xrow[j] += 128;
  }
}

// decode and multiply one k-pair: per row tile 2 k-groups x 4 MMA steps x MT n8 tiles
static __device__ __forceinline__ void mma_kpair(const uint4 (&wv2)[TN][2], const u32 (&sv)[TN],
                                                 const uint4 (&xv)[MT][4], float (&acc)[TN][MT][4]) {
#pragma unroll
  for (int u = 0; u < TN; ++u) {
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const u32 sg = scale_pair(sv[u], par ? 0x4242u : 0x4040u);
      const u32 sg8 = scale_pair(sv[u], par ? 0x4343u : 0x4141u);
      const uint4 wv = wv2[u][par];
      const u32 ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        u32 a[4];
        decode(ws[st], sg, sg8, a);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const uint4 xb = xv[j][par * 2 + (st >> 1)];
          const u32 b0 = (st & 1) ? xb.z : xb.x;
          const u32 b1 = (st & 1) ? xb.w : xb.y;
          mma(acc[u][j], a, b0, b1);
        }
      }
    }
  }
}

// x rows of the dense and grouped kernels: one pointer per n8 tile, a k-pair on per load
struct XRows {
  const u16* row[MT];
  __device__ __forceinline__ void first(uint4 (&xv)[MT][4]) { load_x(row, xv); }
  __device__ __forceinline__ void ahead(int i, int total, uint4 (&xn)[MT][4]) {
    if (XPRE && i + 1 < total) load_x(row, xn);
  }
  __device__ __forceinline__ void step_done(float (&)[TN][MT][4]) {}
};

// one k-pair of the main loop: (XPRE) the next k-pair's x into `xn` first (xs.ahead), then wait for this
// k-pair's ring stage, read it, refill the ring from `src`, multiply with `xc`, and xs.step_done
template <class Src, class Xs>
static __device__ __forceinline__ void kstep(int i, int total, unsigned char* wslot0, unsigned char* sslot0, int& rslot,
                                             int& wslot, int& issued, Src& src, Xs& xs, const uint4 (&xc)[MT][4],
                                             uint4 (&xn)[MT][4], float (&acc)[TN][MT][4]) {
  xs.ahead(i, total, xn);
  wait_pending<STAGES - 2>();
  uint4 wv2[TN][2];
  u32 sv[TN];
  read_slot(wslot0, sslot0, rslot, wv2, sv);
  rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
  if (issued < total) {
    issue(wslot0, sslot0, wslot, src);
    src.next();
    ++issued;
    wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
  }
  commit();
  mma_kpair(wv2, sv, xc, acc);
  xs.step_done(acc);
}

// `total` k-pairs: (XPRE) two steps per trip, the x registers swapping roles (no copies between the
// sets); else x loaded at each step
template <class Src, class Xs>
static __device__ __forceinline__ void main_loop(int total, unsigned char* wslot0, unsigned char* sslot0, int& rslot,
                                                 int& wslot, int& issued, Src& src, Xs& xs, float (&acc)[TN][MT][4]) {
#if XPRE
  uint4 xa[MT][4], xb[MT][4];                        // [tile][kgroup*2 + half]
  xs.first(xa);
#pragma unroll 2
  for (int i = 0; i < total; i += 2) {
    kstep(i, total, wslot0, sslot0, rslot, wslot, issued, src, xs, xa, xb, acc);
    if (i + 1 < total) kstep(i + 1, total, wslot0, sslot0, rslot, wslot, issued, src, xs, xb, xa, acc);
  }
#else
#pragma unroll 4
  for (int i = 0; i < total; ++i) {
    uint4 xv[MT][4];
    xs.first(xv);
    kstep(i, total, wslot0, sslot0, rslot, wslot, issued, src, xs, xv, xv, acc);
  }
#endif
}
