// Grouped-MoE decode GEMM on the cuda family's prepacked layout: for every routed (token, slot) pair
// p = token * TOPK + slot with expert e = ids[p], y[p] = x[token or p] (bf16) * W_e^T (NVFP4 or MXFP4),
// times the routing weight when given; optionally SwiGLU on vLLM's [gate; up] rows (SWIGLU).
//
// Direct route (g_main = 0): grid (P pair slots, N row-tile groups, SPLITK K splits), read straight
// from topk_ids (no alignment launch). The CTA of pair slot q leads when q's rank among the pairs
// routed to its expert (in pair order) is a multiple of CAP = 8*MT; it gathers the next CAP pairs of
// that expert (one n8 MMA tile of x rows per 8 pairs) and runs w4a16_mma's main loop on that
// expert's weight. Every other CTA exits after the rank scan (O(P) per CTA: small P only). Id -1
// (expert not on this rank): a zero row, no weight read; an id outside [-1, E): a NaN row and the
// sticky `bad` word set, so an invalid id never yields a plausible row.
// Aligned route (g_main > 0, large P): moe_align's blocks of bm sorted pair ids (one expert per
// block, stable, padded with the sentinel P; blk_e[b] = -1 past the padded total) cut in bm / CAP
// groups, one CTA each: the same groups as the direct route's leaders (ranks [i*CAP, (i+1)*CAP) of
// an expert's pairs), so a row's bits do not depend on the route. Pairs routed nowhere are in no
// block: the ceil(P / SPAN) CTAs after the groups write their rows, SPAN pairs each.
// A shared expert folded in as expert E - 1 (shared_e >= 0) is every token's last slot without being
// in topk_ids (pair_id): the caller concatenates no ids and no weights (docs/moe-decode.md part 8).
//
// SPLITK > 1: each split stores its fp32 partial rows to ws [SPLITK][P][N]; the last split of a
// (pair slot, N tile) to arrive (counter per slot and tile, fenced) sums the partials in split
// order (deterministic: the same order whichever arrives last), runs the epilogue and resets the
// counter: one launch, no memset, graph-capturable.
// REDUCE = 1 (w2 with the top_k slots summed, y [M][N]): each pair's final fp32 row (routing weight
// applied) goes to red [P][N]; a counter per (token, N tile) counts the token's slots (pairs routed
// nowhere count too, as zero or NaN rows); the CTA that brings the last one sums the token's rows in
// slot order (deterministic), writes y[token] and resets the counter.
// Programmatic dependent launch (launch.py): a CTA waits for the previous kernel (pdl_wait) before
// it reads anything, then lets the next kernel start.
// NW > 1 (REDUCE, SPLITK 1): CTA (q, y) runs its route once and then N tiles y*NW .. y*NW + NW - 1 one
// after another (the same per-tile arithmetic, so the same bits as NW 1): the route and the CTA's
// start are paid once per walk (docs/moe-decode.md part 13).
// Prefetch (pfa non-null, direct route): the CTAs of each expert's first group put that expert's slice
// of the next kernel's weights (w2's, given by w13's caller) into L2 after their route, so the next
// kernel reads L2, not DRAM, where both kernels' bytes fit in it (small M: the runtime decides).
// Config (MT, WK, STAGES, TN, SPLITK, SWIGLU, REDUCE, NW), the format's (SW, SCALE_MUL, SCALE_ADD,
// EPI_SCALE) and the layout's constants come as -D macros. No headers: build.text prepends
// mma_common.cuh and moe_common.cuh (pair_id, pair_weight); the same text compiles under NVRTC and nvcc,
// for sm_80 and newer.
#define NTHREADS (WK * 32)
#define CAP (8 * MT)
#ifndef NW
#define NW 1                  // N tiles a CTA walks after its route (REDUCE, split_k 1: the verdict's rule)
#endif
#if NW > 1 && (SPLITK > 1 || !REDUCE || SWIGLU)
#error "n_walk > 1 walks the reduce epilogue's N tiles with split_k 1 only"
#endif
#define NTILES (gridDim.y * NW)   // N tiles of the problem: the counters' row length
#define SPAN (8 * NTHREADS)   // aligned route: pairs per CTA that writes the rows of pairs routed nowhere
#define PIPE_BYTES (STAGES * NTHREADS * 36 * TN)
#define RED_BYTES (WK * TN * MT * 4 * 32 * 4)
#define SMEM_BYTES (PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES)
#if SWIGLU
#define OUT_TN (TN / 2)       // tiles 0..TN/2-1 are gate rows, TN/2..TN-1 the matching up rows
#else
#define OUT_TN TN
#endif
#if SW == 16
#define SLANE(l) ((l) >> 1)   // MXFP4: lanes t and t^1 share one 32-k block, one scale word
#else
#define SLANE(l) (l)
#endif

#if SPLITK > 1 || REDUCE
// another CTA's partial: from L2 (L1 is not coherent across SMs)
static __device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
#endif

// pair q routed nowhere, N tile nt (split 0 only): id -1 a zero row, any other id outside [0, E) a
// NaN row and `bad` set. REDUCE: the pair's fp32 row, counted toward its token (every slot counts);
// the CTA that brings a token's last slot sums its rows in slot order. CTA-collective (every thread
// with the same q: REDUCE synchronizes; flag_s is a shared int).
static __device__ __forceinline__ void empty_pair(int q, bool isbad, int nt, u16* __restrict__ y, int* __restrict__ bad,
                                                  float* __restrict__ red, int* __restrict__ cnt, int N, int nout,
                                                  int top_k, int* flag_s) {
  const int tid = threadIdx.x;
  if (isbad && nt == 0 && tid == 0) atomicExch(bad, 1);
#if REDUCE
  (void)nout;
  const float fv = isbad ? __int_as_float(0x7fc00000) : 0.f;
  for (int c = tid; c < 16 * TN; c += NTHREADS) red[(size_t)q * N + nt * 16 * TN + c] = fv;
  __threadfence();
  __syncthreads();
  if (tid == 0) *flag_s = atomicAdd(cnt + (size_t)(q / top_k) * NTILES + nt, 1) == top_k - 1;
  __syncthreads();
  if (*flag_s) {                                   // this row completed its token: sum it
    __threadfence();
    const int tok = q / top_k;
    for (int c = tid; c < 16 * TN; c += NTHREADS) {
      float s = 0.f;
      for (int sl = 0; sl < top_k; ++sl) s += ld_cg(red + ((size_t)tok * top_k + sl) * N + nt * 16 * TN + c);
      y[(size_t)tok * N + nt * 16 * TN + c] = to_bf16(s);
    }
    if (tid == 0) atomicExch(cnt + (size_t)tok * NTILES + nt, 0);
  }
  __syncthreads();                                 // flag_s is read before the next call writes it
#else
  (void)red; (void)cnt; (void)N; (void)top_k; (void)flag_s;
  const u16 v = isbad ? (u16)0x7FC0 : (u16)0;     // bf16 NaN / +0
  for (int c = tid; c < 16 * OUT_TN; c += NTHREADS) y[(size_t)q * nout + nt * 16 * OUT_TN + c] = v;
#endif
}

// the ring's first STAGES - 1 k-pairs (advancing wp, sp); returns how many were issued
static __device__ __forceinline__ int prologue(unsigned char* wslot0, unsigned char* sslot0, const uint4* (&wp)[TN],
                                               const u32* (&sp)[TN], int kpairs) {
  int issued = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (issued < kpairs) {
      issue(wslot0, sslot0, i, wp, sp);
#pragma unroll
      for (int u = 0; u < TN; ++u) { wp[u] += 64; sp[u] += SW; }
      ++issued;
    }
    commit();
  }
  return issued;
}

// one k-pair of the main loop: (XPRE) the next k-pair's x into `xn` first, then wait for this
// k-pair's ring stage, read it, refill the ring, and multiply with `xc`
static __device__ __forceinline__ void kstep(int i, int kpairs, unsigned char* wslot0, unsigned char* sslot0,
                                             int& rslot, int& wslot, int& issued, const uint4* (&wp)[TN],
                                             const u32* (&sp)[TN], const u16* (&xrow)[MT], const uint4 (&xc)[MT][4],
                                             uint4 (&xn)[MT][4], float (&acc)[TN][MT][4]) {
  if (XPRE && i + 1 < kpairs) load_x(xrow, xn);
  wait_pending<STAGES - 2>();
  uint4 wv2[TN][2];
  u32 sv[TN];
  read_slot(wslot0, sslot0, rslot, wv2, sv);
  rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
  if (issued < kpairs) {
    issue(wslot0, sslot0, wslot, wp, sp);
#pragma unroll
    for (int u = 0; u < TN; ++u) { wp[u] += 64; sp[u] += SW; }
    ++issued;
    wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
  }
  commit();
  mma_kpair(wv2, sv, xc, acc);
}

// wq: fragment words [E][N/16][K/64][32][4]; sq: scale words [E][N/16][K/128][SW];
// x [tokens][K] or [P][K] (x_pair); y [P][N or N/2]; gscale [E] (gs_stride 1) or [1];
// ids [P] (int32/int64; with a shared slot [P / top_k][ids_cols]); tw [P] fp32 (routed; likewise); ws [SPLITK][P][N] fp32;
// locks [max(P, group CTAs)][gridDim.y]; bad [1]; REDUCE: y [P / top_k][N], red [P][N] fp32, cnt [P / top_k][N tiles];
// aligned route (g_main > 0): srt [g_main * bm] sorted pair ids, blk_e [g_main] experts (bm a multiple of CAP);
// pfa / pfb (direct route; null: none): the next kernel's stacked weights, pfa_bytes / pfb_bytes per expert
// (multiples of 16, 16-byte aligned): the first group of each expert prefetches its slice of both into L2
extern "C" __global__ void __launch_bounds__(NTHREADS)
moe_mma(const uint4* __restrict__ wq, const u32* __restrict__ sq, const u16* __restrict__ x,
        u16* __restrict__ y, const float* __restrict__ gscale, const void* __restrict__ ids,
        const float* __restrict__ tw, float* __restrict__ ws, int* __restrict__ locks, int* __restrict__ bad,
        float* __restrict__ red, int* __restrict__ cnt, int P, int N, int K, int top_k, int n_exp, int ids64, int x_pair, int routed, int gs_stride,
        int shared_e, int ids_cols, const int* __restrict__ srt, const int* __restrict__ blk_e, int g_main, int bm,
        const char* __restrict__ pfa, const char* __restrict__ pfb, int pfa_bytes, int pfb_bytes) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  __shared__ int rows_s[CAP];                     // the group's pair indices, -1 past its end
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int q = blockIdx.x, nt0 = blockIdx.y * NW, kz = blockIdx.z;
  const int nout = SWIGLU ? N / 2 : N;
  (void)nout;                                     // unused by the REDUCE variant
  pdl_wait();                                     // every read of inputs and every write after it
  pdl_release();
  const int groups = g_main > 0 ? g_main * (bm / CAP) : P;   // CTAs that may lead a group
  int e, b0 = 0;                                  // aligned: the group's first sorted row
  if (g_main > 0 && q >= groups) {                 // aligned: rows of pairs routed nowhere, SPAN per CTA
    if (kz != 0) return;
    int* const list = reinterpret_cast<int*>(smem);  // SPAN ints fit the ring: 36 * STAGES * TN >= 72 B per thread
    if (tid == 0) rows_s[0] = 0;
    __syncthreads();
    const int s0 = (q - groups) * SPAN, s1 = min(P, s0 + SPAN);
    for (int j = s0 + tid; j < s1; j += NTHREADS) {
      const long long v = pair_id(ids, ids64, j, top_k, ids_cols, shared_e);
      if (v < 0 || v >= n_exp) list[atomicAdd(rows_s, 1)] = v == -1 ? j : -j - 1;   // bad ids as -j - 1
    }
    __syncthreads();
    const int n = rows_s[0];                       // the order does not matter: each row is its own
    for (int w = 0; w < NW; ++w)
      for (int i = 0; i < n; ++i) {
        const int c = list[i];
        empty_pair(c >= 0 ? c : -c - 1, c < 0, nt0 + w, y, bad, red, cnt, N, nout, top_k, rows_s + 1);
      }
    return;
  }
  if (g_main > 0) {                                // aligned: group q is CAP rows of block q / (bm / CAP)
    const int sub = bm / CAP, b = q / sub;
    b0 = b * bm + (q - b * sub) * CAP;
    e = blk_e[b];
    if (e < 0 || e >= n_exp || (unsigned)srt[b0] >= (unsigned)P) return;   // past the padded total, padding only
                                                   // (or a row outside [0, P): the group's first row is read below)
  } else {
    const long long eid = pair_id(ids, ids64, q, top_k, ids_cols, shared_e);
    if (eid < 0 || eid >= n_exp) {                 // no expert: this pair's row, written by split 0
      if (kz == 0)
        for (int w = 0; w < NW; ++w) empty_pair(q, eid != -1, nt0 + w, y, bad, red, cnt, N, nout, top_k, rows_s);
      return;
    }
    e = (int)eid;
  }
  const int kps = K / 128 / SPLITK;                // k-pairs of this split
  const int kpairs = kps / WK;                     // k-pairs this warp reduces
  const int kp0 = kz * kps + warp * kpairs;
  const size_t wtile = (size_t)(K / 64) * 32, stile = (size_t)(K / 128) * SW;
  const uint4* const wexp = wq + (size_t)e * (N / 16) * wtile;
  const u32* const sexp = sq + (size_t)e * (N / 16) * stile;
  int tile[TN];
  const uint4* wp[TN];
  const u32* sp[TN];
#pragma unroll
  for (int u = 0; u < TN; ++u) {
#if SWIGLU
    tile[u] = u < TN / 2 ? nt0 * (TN / 2) + u : N / 32 + nt0 * (TN / 2) + (u - TN / 2);
#else
    tile[u] = nt0 * TN + u;
#endif
    wp[u] = wexp + tile[u] * wtile + 2 * kp0 * 32 + lane;
    sp[u] = sexp + tile[u] * stile + kp0 * SW + SLANE(lane);
  }
  float acc[TN][MT][4];
#pragma unroll
  for (int u = 0; u < TN; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;

  unsigned char* const wslot0 = smem + tid * 16;                 // this thread's column of the ring
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  if (g_main > 0) {                                // the group's rows: sentinels (padding) as -1
    if (tid < CAP) {
      const int p = srt[b0 + tid];               // padding (the sentinel P) and any value outside [0, P): no row
      rows_s[tid] = (unsigned)p < (unsigned)P ? p : -1;
    }
  } else {
    // rank of q among the pairs of its expert: CTA-uniform, so the exit below is uniform
    int rank = 0;
    for (int j0 = 0; j0 < q; j0 += NTHREADS) {
      const int j = j0 + tid;
      rank += __syncthreads_count(j < q && pair_id(ids, ids64, j, top_k, ids_cols, shared_e) == e);
    }
    if (rank % CAP) return;                        // not a leader (nothing issued yet)
    if (rank == 0 && pfa != nullptr) {             // the expert's first group: its slice of the next kernel's
      const int s = blockIdx.y * gridDim.z + kz, ns = gridDim.y * gridDim.z;   // weights into L2 (pfa/pfb)
      const longlong2 sa = pf_slice(s, ns, pfa_bytes), sb = pf_slice(s, ns, pfb_bytes);
      prefetch_l2(pfa + (size_t)e * pfa_bytes + sa.x, (int)sa.y, tid, NTHREADS);
      prefetch_l2(pfb + (size_t)e * pfb_bytes + sb.x, (int)sb.y, tid, NTHREADS);
    }
    if (warp == 0) {                               // gather the next CAP pairs of this expert, in order
      int cnt = 0;
      for (int j0 = q; j0 < P && cnt < CAP; j0 += 32) {
        const int j = j0 + lane;
        const bool hit = j < P && pair_id(ids, ids64, j, top_k, ids_cols, shared_e) == e;
        const u32 m = __ballot_sync(0xffffffffu, hit);
        const int pos = cnt + __popc(m & ((1u << lane) - 1u));
        if (hit && pos < CAP) rows_s[pos] = j;
        cnt += __popc(m);
      }
      for (int i = lane; i < CAP; i += 32)
        if (i >= cnt) rows_s[i] = -1;
    }
  }
  __syncthreads();
  const int r0 = rows_s[0];
  for (int w = 0; w < NW; ++w) {                 // NW > 1: the walk over this CTA's N tiles
    const int nt = nt0 + w;                   // this trip's N tile
    const u16* xrow[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      // a row past the group feeds only output columns never stored: read the group's first row
      int p = rows_s[8 * j + g];
      if (p < 0) p = r0;
      const int xr = x_pair ? p : p / top_k;
      xrow[j] = x + (size_t)xr * K + kp0 * 128 + 16 * t;
    }
    // the weight prologue after the scan: issued before it, the ring's first k-pairs were fetched by
    // CTAs that do not lead too (0-9 % slower on the H200, docs/moe-decode.md part 7)
    int issued = prologue(wslot0, sslot0, wp, sp, kpairs);
    int rslot = 0, wslot = STAGES - 1;
#if XPRE
    // two steps per trip, the x registers swapping roles: no copies between the sets
    uint4 xa[MT][4], xb[MT][4];                        // [tile][kgroup*2 + half]
    load_x(xrow, xa);
#pragma unroll 2
    for (int i = 0; i < kpairs; i += 2) {
      kstep(i, kpairs, wslot0, sslot0, rslot, wslot, issued, wp, sp, xrow, xa, xb, acc);
      if (i + 1 < kpairs) kstep(i + 1, kpairs, wslot0, sslot0, rslot, wslot, issued, wp, sp, xrow, xb, xa, acc);
    }
#else
#pragma unroll 4
    for (int i = 0; i < kpairs; ++i) {
      uint4 xv[MT][4];
      load_x(xrow, xv);
      kstep(i, kpairs, wslot0, sslot0, rslot, wslot, issued, wp, sp, xrow, xv, xv, acc);
    }
#endif
    wait_pending<0>();
    __syncthreads();
    float* wred = reinterpret_cast<float*>(smem);       // [WK][TN*MT*4][32]
#define RED(w, u, j, c) wred[((((w) * TN + (u)) * MT + (j)) * 4 + (c)) * 32 + lane]
#pragma unroll
    for (int u = 0; u < TN; ++u)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) RED(warp, u, j, c) = acc[u][j][c];
    __syncthreads();
#if NW == 1
    if (warp != 0) return;
#else
    if (warp == 0) {                                 // the epilogue is warp 0's; the others wait below
#endif
#pragma unroll
    for (int u = 0; u < TN; ++u)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float v = 0.f;
          for (int wi = 0; wi < WK; ++wi) v += RED(wi, u, j, c);  // warp order: deterministic
          acc[u][j][c] = v;
        }
#if SPLITK > 1
#pragma unroll
    for (int u = 0; u < TN; ++u)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int p = rows_s[8 * j + 2 * t + (c & 1)];
          if (p >= 0) ws[((size_t)kz * P + p) * N + tile[u] * 16 + g + (c >> 1) * 8] = acc[u][j][c];
        }
    __threadfence();                                   // this split's partials before its arrival
    __syncwarp();
    int old = 0;
    int* const lock = locks + (size_t)q * gridDim.y + nt;
    if (lane == 0) old = atomicAdd(lock, 1);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != SPLITK - 1) return;
    __threadfence();                                   // the other splits' partials are visible (L2)
#pragma unroll
    for (int u = 0; u < TN; ++u)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int p = rows_s[8 * j + 2 * t + (c & 1)];
          float v = 0.f;
          if (p >= 0)
            for (int s = 0; s < SPLITK; ++s)            // split order: deterministic
              v += ld_cg(ws + ((size_t)s * P + p) * N + tile[u] * 16 + g + (c >> 1) * 8);
          acc[u][j][c] = v;
        }
    if (lane == 0) atomicExch(lock, 0);                // ready for the next launch
#endif
    const float alpha = gscale[(size_t)e * gs_stride] * EPI_SCALE;
#pragma unroll
    for (int u = 0; u < OUT_TN; ++u)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int p = rows_s[8 * j + 2 * t + (c & 1)];
          if (p < 0) continue;
          float v = acc[u][j][c] * alpha;
#if SWIGLU
          const float up = acc[u + TN / 2][j][c] * alpha;
          v = v / (1.f + __expf(-v)) * up;
#endif
          if (routed) v *= pair_weight(tw, p, top_k, ids_cols, shared_e);
#if REDUCE
          red[(size_t)p * N + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8] = v;
#else
          y[(size_t)p * nout + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8] = to_bf16(v);
#endif
        }
#if REDUCE
    __threadfence();                                   // this CTA's rows before its arrivals
    __syncwarp();
    int last = 0;
    if (lane < CAP) {
      const int p = rows_s[lane];
      if (p >= 0) last = atomicAdd(cnt + (size_t)(p / top_k) * NTILES + nt, 1) == top_k - 1;
    }
    u32 lm = __ballot_sync(0xffffffffu, last);
    if (lm) __threadfence();
    while (lm) {                                       // tokens whose last slot this CTA brought
      const int i = __ffs(lm) - 1;
      lm &= lm - 1;
      const int tok = rows_s[i] / top_k;
      for (int c = lane; c < 16 * TN; c += 32) {
        float s = 0.f;
        for (int sl = 0; sl < top_k; ++sl) s += ld_cg(red + ((size_t)tok * top_k + sl) * N + nt * 16 * TN + c);
        y[(size_t)tok * N + nt * 16 * TN + c] = to_bf16(s);
      }
      if (lane == 0) atomicExch(cnt + (size_t)tok * NTILES + nt, 0);
    }
#endif
#if NW > 1
    }
    if (w + 1 < NW) {                                // the next trip's tile: pointers at K's start, sums zeroed
#pragma unroll
      for (int u = 0; u < TN; ++u) {
        tile[u] += TN;
        wp[u] = wexp + tile[u] * wtile + 2 * kp0 * 32 + lane;
        sp[u] = sexp + tile[u] * stile + kp0 * SW + SLANE(lane);
#pragma unroll
        for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;
      }
    }
    __syncthreads();                                 // the ring (and the sum's buffer) is the next trip's
#endif
  }
}
