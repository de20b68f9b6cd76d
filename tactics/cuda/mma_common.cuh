// Device helpers shared by the cuda family's kernels (build.text joins the shared parts and the kernel
// into one text: NVRTC and nvcc then see no #include). The layout's bit constants (ROT*/MASK*) and the
// format's scale decode (SCALE_MUL, SCALE_ADD) come as -D macros (config.cuh).
typedef unsigned int u32;
typedef unsigned short u16;

static __device__ __forceinline__ u32 rotr(u32 x, u32 d) { return __funnelshift_r(x, x, d); }

// bf16x2 multiply as fma with -0 (sm_80 has no bf16x2 mul; -0 keeps the sign of a zero product)
static __device__ __forceinline__ u32 bmul2(u32 a, u32 b) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// (s, s) as bf16x2 from scale byte `sel` of the thread's scale word (NVFP4: the u code, s * 2^16 in
// each lane; MXFP4: the E8M0 byte, 2^(b-127) * 2^110): one PRMT, one IMAD (SCALE_MUL, SCALE_ADD)
static __device__ __forceinline__ u32 scale_pair(u32 word, u32 sel) {
  return __byte_perm(word, 0u, sel) * SCALE_MUL + SCALE_ADD;
}

// one A fragment: 8 e2m1 codes -> 4 bf16x2 registers, times the rows' scales (rows g, g+8)
static __device__ __forceinline__ void decode(u32 w, u32 sg, u32 sg8, u32 a[4]) {
  a[0] = bmul2(rotr(w, ROT0) & MASK0, sg);
  a[1] = bmul2(rotr(w, ROT1) & MASK1, sg8);
  a[2] = bmul2(rotr(w, ROT2) & MASK2, sg);
  a[3] = bmul2((rotr(w, ROT3A) & MASK3A) | (rotr(w, ROT3B) & MASK3B), sg8);
}

static __device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
static __device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src));
}
static __device__ __forceinline__ void cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_addr(dst)), "l"(src));
}
static __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
static __device__ __forceinline__ uint4 ldg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Programmatic dependent launch (sm_90+; no-ops where the launch carries no such attribute):
// `pdl_wait` blocks until the previous kernel in the stream has finished and its writes are
// visible, `pdl_release` lets the next kernel's CTAs start (they then block in their own wait).
// Nothing a kernel reads from another kernel, and nothing it writes, comes before its wait.
static __device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_release() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ u16 to_bf16(float f) {
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

