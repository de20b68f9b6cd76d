// The cp.async ring every cuda kernel streams its weight through (build.text joins it after
// mma_common.cuh): its layout, the one `issue` that fills a stage from a weight source, the prologue
// and the read side. Each thread reads only the bytes it wrote, so no barrier guards a stage's reuse.
// The cp.async ring, [STAGES][TN][2][WK*32] x 16 B of fragment words then [STAGES][TN][WK*32] x 4 B
// of scales: a thread's 16 B words lie beside its neighbours' (consecutive threads, consecutive
// 16 B), so neither the cp.async writes nor the reads below conflict on a bank (a per-thread slot
// of TN*32 B made them 2*TN-way). Offsets from the thread's own base (smem + tid*16, sbase + tid*4).
#define RING_W(st, u, h) (((((st) * TN + (u)) * 2 + (h)) * (WK * 32)) * 16)
#define RING_S(st, u) ((((st) * TN + (u)) * (WK * 32)) * 4)
#define RING_WBYTES (STAGES * TN * 2 * (WK * 32) * 16)   // where the scales start

// this thread's words and scales of ring stage `rslot`: per row tile 2 x 16 B and 4 B
static __device__ __forceinline__ void read_slot(const unsigned char* wslot0, const unsigned char* sslot0, int rslot,
                                                 uint4 (&wv2)[TN][2], u32 (&sv)[TN]) {
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    wv2[u][0] = *reinterpret_cast<const uint4*>(wslot0 + RING_W(rslot, u, 0));
    wv2[u][1] = *reinterpret_cast<const uint4*>(wslot0 + RING_W(rslot, u, 1));
    sv[u] = *reinterpret_cast<const u32*>(sslot0 + RING_S(rslot, u));
  }
}

// weight sources: `w(u)` / `s(u)` the next k-pair's fragment words and scale word of row tile u,
// `next()` one k-pair on. TileBase: tiles `wtile` / `stile` apart from one base (SWIGLU: the up tiles,
// u >= TN/2, `wgap` / `sgap` further on, N/2 rows past their gate tiles); TilePtrs: one pointer per tile.
struct TileBase {
  const uint4* wb;
  const u32* sb;
  size_t wtile, stile, wgap, sgap;
  __device__ __forceinline__ const uint4* w(int u) const { return wb + (u * wtile + (SWIGLU && u >= TN / 2 ? wgap : 0)); }
  __device__ __forceinline__ const u32* s(int u) const { return sb + (u * stile + (SWIGLU && u >= TN / 2 ? sgap : 0)); }
  __device__ __forceinline__ void next() { wb += 64; sb += SW; }
};
struct TilePtrs {
  const uint4* wp[TN];
  const u32* sp[TN];
  __device__ __forceinline__ const uint4* w(int u) const { return wp[u]; }
  __device__ __forceinline__ const u32* s(int u) const { return sp[u]; }
  __device__ __forceinline__ void next() {
#pragma unroll
    for (int u = 0; u < TN; ++u) { wp[u] += 64; sp[u] += SW; }
  }
};

// one k-pair of every row tile into ring stage `st`: TN x 2 x 16 B words, TN x 4 B scales
template <class Src>
static __device__ __forceinline__ void issue(unsigned char* wslot0, unsigned char* sslot0, int st, const Src& src) {
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    cp16(wslot0 + RING_W(st, u, 0), src.w(u));
    cp16(wslot0 + RING_W(st, u, 1), src.w(u) + 32);
    cp4(sslot0 + RING_S(st, u), src.s(u));
  }
}

// the ring's first STAGES - 1 k-pairs of `total` (advancing src); returns how many were issued
template <class Src>
static __device__ __forceinline__ int prologue(unsigned char* wslot0, unsigned char* sslot0, Src& src, int total) {
  int issued = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (issued < total) {
      issue(wslot0, sslot0, i, src);
      src.next();
      ++issued;
    }
    commit();
  }
  return issued;
}
