// Routing helpers of the cuda family's grouped-MoE kernels (moe_mma.cu, moe_tok.cu): build.text joins
// this file after the shared parts, so both kernels read ids the same way (weights: epilogue.cuh).
// topk_ids as int32 or int64 (ids64): compared as 64-bit, so no id is truncated into range
static __device__ __forceinline__ long long load_id(const void* ids, int ids64, int j) {
  long long v;
  if (ids64) {
    asm volatile("ld.global.nc.s64 %0, [%1];" : "=l"(v) : "l"(reinterpret_cast<const long long*>(ids) + j));
  } else {
    int i;
    asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(i) : "l"(reinterpret_cast<const int*>(ids) + j));
    v = i;
  }
  return v;
}
// pair q's expert: topk_ids[q], or with a shared slot (shared_e >= 0: a shared expert folded in as
// expert shared_e = E - 1) the token's last slot is that expert, which topk_ids does not hold (its
// rows have ids_cols = top_k - 1 ids), and a routed id >= shared_e is out of range (-2: a NaN row)
static __device__ __forceinline__ long long pair_id(const void* ids, int ids64, int q, int top_k, int ids_cols,
                                                    int shared_e) {
  if (shared_e < 0) return load_id(ids, ids64, q);
  const int tok = q / top_k, slot = q - tok * top_k;
  if (slot == top_k - 1) return shared_e;
  const long long v = load_id(ids, ids64, tok * ids_cols + slot);
  return v >= shared_e ? -2 : v;
}

// L2 prefetch of the next kernel's weights (w2's, issued by w13's CTAs at small M). Slice s of n_s of
// an expert's `bytes` (a multiple of 16): {start, len}, each slice 16-byte aligned, len 0 past the end;
// returned by value (an address-taken local became a 16-byte stack frame on sm_90: a refused kernel);
// host and device (tests compile it for the host).
static __host__ __device__ __forceinline__ longlong2 pf_slice(int s, int n_s, long long bytes) {
  const long long chunk = (bytes + (long long)n_s * 16 - 1) / ((long long)n_s * 16) * 16;
  const long long a = (long long)s * chunk;
  return make_longlong2(a < bytes ? a : bytes, a < bytes ? (bytes - a < chunk ? bytes - a : chunk) : 0);
}
// [p, p + len) into L2, no registers and no wait: one bulk prefetch on sm_90+ (thread 0; len < 2^31:
// moe_checks.check_prefetch keeps an expert under 2 GiB), else one prefetch per 128-byte line spread
// over the CTA's threads. A hint: nothing waits for it or reads it. 32-bit and loop-free on sm_90: a
// 64-bit loop here capped a 2-warp config at 64 registers with spills (ptxas 13.0, sm_90).
static __device__ __forceinline__ void prefetch_l2(const char* p, int len, int tid, int nthreads) {
#if __CUDA_ARCH__ >= 900
  if (tid == 0 && len > 0)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(len) : "memory");
#else
  for (int o = tid * 128; o < len; o += nthreads * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}
