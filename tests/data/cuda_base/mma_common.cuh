// Device helpers shared by the cuda family's kernels (build.text prepends this file to each kernel's
// source: NVRTC and nvcc then see one text with no #include). The layout's bit constants (ROT*/MASK*)
// and the format's scale decode (SCALE_MUL, SCALE_ADD) come as -D macros.
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

// ---- one k-pair of the main loop, shared by both kernels (MT, TN, WK, STAGES from -D) ------------
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
