// Reductions every cuda kernel shares (build.text joins this file after mainloop.cuh): the warps'
// partial sums through shared memory in warp order, and the split-K arrival (each split's fp32
// partials to a workspace, a counter per output tile; the last split to arrive sums them in split
// order, so the bits do not depend on which arrives last) over a row-index functor:
//   R.row(j, c): the output row of n8 tile j's value c (its column of x), R.has(r): whether it is
//   stored, R.rows: rows per split in the workspace, R.at(base, u, c): base plus the weight row of tile u's
//   value c.

// another CTA's partial: from L2 (L1 is not coherent across SMs)
static __device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// the cross-warp reduction's buffer, [WK][TN*MT*4][32] floats over the ring (lane: the thread's)
#define RED(w, u, j, c) red[((((w) * TN + (u)) * MT + (j)) * 4 + (c)) * 32 + lane]

// every warp's sums into the buffer over the ring once it is drained; every thread returns (the buffer)
// after the barrier
static __device__ __forceinline__ float* warps_publish(unsigned char* smem, int warp, int lane,
                                                       const float (&acc)[TN][MT][4]) {
  wait_pending<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  FOR_VALUES(TN, u, j, c) RED(warp, u, j, c) = acc[u][j][c];
  __syncthreads();
  return red;
}

// value (u, j, c) summed over the warps in warp order (deterministic)
static __device__ __forceinline__ float warps_sum(const float* red, int lane, int u, int j, int c) {
  float v = 0.f;
  for (int w = 0; w < WK; ++w) v += RED(w, u, j, c);
  return v;
}

// warp 0: acc = the warps' sums
static __device__ __forceinline__ void warps_total(const float* red, int lane, float (&acc)[TN][MT][4]) {
  FOR_VALUES(TN, u, j, c) acc[u][j][c] = warps_sum(red, lane, u, j, c);
}

// split `split`'s partials into ws [SPLITK][R.rows][N], then its arrival at `lock` (warp 0, fenced);
// true for the split that arrives last (it then sums: splitk_sum)
template <class Rows>
static __device__ __forceinline__ bool splitk_arrive(float* ws, int* lock, size_t split, int N, int lane, const Rows& R,
                                                     const float (&acc)[TN][MT][4]) {
  FOR_VALUES(TN, u, j, c) {
    const int r = R.row(j, c);
    if (R.has(r)) ws[R.at((split * R.rows + r) * N, u, c)] = acc[u][j][c];
  }
  __threadfence();                                   // this split's partials before its arrival
  __syncwarp();
  int old = 0;
  if (lane == 0) old = atomicAdd(lock, 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  return old == SPLITK - 1;
}

// the last split: acc = every split's partials in split order; the counter reset for the next launch
template <class Rows>
static __device__ __forceinline__ void splitk_sum(const float* ws, int* lock, int N, int lane, const Rows& R,
                                                  float (&acc)[TN][MT][4]) {
  __threadfence();                                   // the other splits' partials are visible (L2)
  FOR_VALUES(TN, u, j, c) {
    const int r = R.row(j, c);
    float v = 0.f;
    if (R.has(r))
      for (int s = 0; s < SPLITK; ++s)            // split order: deterministic
        v += ld_cg(ws + R.at(((size_t)s * R.rows + r) * N, u, c));
    acc[u][j][c] = v;
  }
  if (lane == 0) atomicExch(lock, 0);                // ready for the next launch
}
