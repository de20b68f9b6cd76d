// Epilogues every cuda kernel shares (build.text joins this file after reduce.cuh): the output value
// of a summed row (global scale; SWIGLU: silu(gate) * up of the tile pair), the routing weight, and
// the store loop over a row-index functor (reduce.cuh's R.row / R.has) into a kernel's `store(r, u, c, v)`,
// the bf16 store.

// value (u, j, c) of an output tile: acc times alpha; SWIGLU: silu(gate) * up, up being tile u + TN/2
static __device__ __forceinline__ float epi_value(const float (&acc)[TN][MT][4], int u, int j, int c, float alpha) {
  float v = acc[u][j][c] * alpha;
#if SWIGLU
  const float up = acc[u + TN / 2][j][c] * alpha;
  v = v / (1.f + __expf(-v)) * up;
#endif
  return v;
}

// every stored value of the CTA's OUT_TN output tiles: store(r, u, c, v) for each row r that R.has
template <class Rows, class Store>
static __device__ __forceinline__ void epilogue(const float (&acc)[TN][MT][4], float alpha, const Rows& R,
                                                Store store) {
  FOR_VALUES(OUT_TN, u, j, c) {
    const int r = R.row(j, c);
    if (!R.has(r)) continue;
    store(r, u, c, epi_value(acc, u, j, c, alpha));
  }
}

// a bf16 output value at y[at]
static __device__ __forceinline__ void store_bf16(u16* __restrict__ y, size_t at, float v) { y[at] = to_bf16(v); }

// pair p's routing weight: tw[p], or with a shared slot (shared_e >= 0) 1 for it and the routed slots'
// from tw [M][ids_cols]
static __device__ __forceinline__ float pair_weight(const float* tw, int p, int top_k, int ids_cols, int shared_e) {
  if (shared_e < 0) return tw[p];
  const int tok = p / top_k, slot = p - tok * top_k;
  return slot == top_k - 1 ? 1.f : tw[tok * ids_cols + slot];
}
