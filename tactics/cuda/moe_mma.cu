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
// in topk_ids (pair_id): the caller concatenates no ids and no weights.
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
// start are paid once per walk.
// Prefetch (pfa non-null, direct route): the CTAs of each expert's first group put that expert's slice
// of the next kernel's weights (w2's, given by w13's caller) into L2 after their route, so the next
// kernel reads L2, not DRAM, where both kernels' bytes fit in it (small M: the runtime decides).
// Config (MT, WK, STAGES, TN, SPLITK, SWIGLU, REDUCE, NW), the format's (SW, SCALE_MUL, SCALE_ADD,
// EPI_SCALE) and the layout's constants come as -D macros. No headers: build.text joins the shared
// parts and moe_common.cuh (pair_id) before this route and store; the same text compiles under NVRTC
// and nvcc, for sm_80 and newer. The parameters are args.py's declaration.
#define CAP (8 * MT)
#ifndef NW
#define NW 1                  // N tiles a CTA walks after its route (REDUCE, split_k 1: the verdict's rule)
#endif
#if NW > 1 && (SPLITK > 1 || !REDUCE || SWIGLU)
#error "n_walk > 1 walks the reduce epilogue's N tiles with split_k 1 only"
#endif
#define NTILES (gridDim.y * NW)   // N tiles of the problem: the counters' row length
#define SPAN (8 * NTHREADS)   // aligned route: pairs per CTA that writes the rows of pairs routed nowhere

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

// the group's rows: pair rows_s[8j + 2t + (c & 1)] for n8 tile j's value c (-1: none); weight rows of tile u
struct PairRows {
  const int* rows_s;
  int t, g;
  size_t rows;
  const int* tile;
  __device__ __forceinline__ int row(int j, int c) const { return rows_s[8 * j + 2 * t + (c & 1)]; }
  __device__ __forceinline__ bool has(int p) const { return p >= 0; }
  __device__ __forceinline__ size_t at(size_t base, int u, int c) const { return base + tile[u] * 16 + g + (c >> 1) * 8; }
};

// aligned route, a CTA past the groups: the rows of pairs routed nowhere among its SPAN pairs
static __device__ __forceinline__ void nowhere_rows(int tid, int q, int groups, int nt0, unsigned char* smem, int* rows_s,
                                                    const void* ids, int ids64, int P, int top_k, int ids_cols,
                                                    int shared_e, int n_exp, u16* y, int* bad, float* red, int* cnt,
                                                    int N, int nout) {
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
}

// direct route: whether pair slot q leads a group of expert e (its rank among e's pairs a multiple of
// CAP; CTA-uniform); a leader gathers the next CAP pairs of e into rows_s and, as e's first group,
// puts its slice of the next kernel's weights (pfa / pfb) into L2
static __device__ __forceinline__ bool lead_group(int tid, int lane, int warp, int q, int e, int kz, int* rows_s, const void* ids, int ids64, int P,
                                                  int top_k, int ids_cols, int shared_e, const char* pfa,
                                                  const char* pfb, int pfa_bytes, int pfb_bytes) {
  int rank = 0;
  for (int j0 = 0; j0 < q; j0 += NTHREADS) {
    const int j = j0 + tid;
    rank += __syncthreads_count(j < q && pair_id(ids, ids64, j, top_k, ids_cols, shared_e) == e);
  }
  if (rank % CAP) return false;                  // not a leader (nothing issued yet)
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
  return true;
}

// REDUCE: the group's pairs counted toward their tokens (tile nt); the CTA that brings a token's last
// slot sums its rows in slot order into y[token]
static __device__ __forceinline__ void token_sums(const int* rows_s, int nt, int lane, int top_k, int N,
                                                  float* red, int* cnt, u16* y) {
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
}

// warp 0's store of one N tile nt: the warps' sums, the split-K arrival (a split that is not the last
// returns), the epilogue (routing weight) into y, or (REDUCE) into red and the tokens' sums
static __device__ __forceinline__ void tile_store(const float* wred, const PairRows& R, int e, int q, int nt, int kz,
                                                  int lane, float (&acc)[TN][MT][4], u16* __restrict__ y,
                                                  const float* __restrict__ gscale, int gs_stride, int routed,
                                                  const float* __restrict__ tw, int top_k, int ids_cols, int shared_e,
                                                  float* __restrict__ ws, int* __restrict__ locks,
                                                  float* __restrict__ red, int* __restrict__ cnt, int N) {
  const int g = lane >> 2;
  const int nout = SWIGLU ? N / 2 : N;
  (void)nout;                                     // unused by the REDUCE variant
  warps_total(wred, lane, acc);
#if SPLITK > 1
  int* const lock = locks + (size_t)q * gridDim.y + nt;
  if (!splitk_arrive(ws, lock, (size_t)kz, N, lane, R, acc)) return;
  splitk_sum(ws, lock, N, lane, R, acc);
#endif
  const float alpha = gscale[(size_t)e * gs_stride] * EPI_SCALE;
  epilogue(acc, alpha, R, [&](int p, int u, int c, float v) {
    if (routed) v *= pair_weight(tw, p, top_k, ids_cols, shared_e);
#if REDUCE
    red[(size_t)p * N + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8] = v;
#else
    store_bf16(y, (size_t)p * nout + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8, v);
#endif
  });
#if REDUCE
  token_sums(R.rows_s, nt, lane, top_k, N, red, cnt, y);
#endif
}

// wq: fragment words [E][N/16][K/64][32][4]; sq: scale words [E][N/16][K/128][SW];
// x [tokens][K] or [P][K] (x_pair); y [P][N or N/2]; gscale [E] (gs_stride 1) or [1];
// ids [P] (int32/int64; with a shared slot [P / top_k][ids_cols]); tw [P] fp32 (routed; likewise); ws [SPLITK][P][N] fp32;
// locks [max(P, group CTAs)][gridDim.y]; bad [1]; REDUCE: y [P / top_k][N], red [P][N] fp32, cnt [P / top_k][N tiles];
// aligned route (g_main > 0): srt [g_main * bm] sorted pair ids, blk_e [g_main] experts (bm a multiple of CAP);
// pfa / pfb (direct route; null: none): the next kernel's stacked weights, pfa_bytes / pfb_bytes per expert
// (multiples of 16, 16-byte aligned): the first group of each expert prefetches its slice of both into L2
extern "C" __global__ void __launch_bounds__(NTHREADS) moe_mma(MOE_MMA_PARAMS) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  __shared__ int rows_s[CAP];                     // the group's pair indices, -1 past its end
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int q = blockIdx.x, nt0 = blockIdx.y * NW, kz = blockIdx.z;
  const int nout = SWIGLU ? N / 2 : N;
  pdl_wait();                                     // every read of inputs and every write after it
  pdl_release();
  const int groups = g_main > 0 ? g_main * (bm / CAP) : P;   // CTAs that may lead a group
  int e, b0 = 0;                                  // aligned: the group's first sorted row
  if (g_main > 0 && q >= groups) {                 // aligned: rows of pairs routed nowhere, SPAN per CTA
    if (kz != 0) return;
    nowhere_rows(tid, q, groups, nt0, smem, rows_s, ids, ids64, P, top_k, ids_cols, shared_e, n_exp, y, bad, red, cnt,
                 N, nout);
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
  TilePtrs src;
#pragma unroll
  for (int u = 0; u < TN; ++u) {
#if SWIGLU
    tile[u] = u < TN / 2 ? nt0 * (TN / 2) + u : N / 32 + nt0 * (TN / 2) + (u - TN / 2);
#else
    tile[u] = nt0 * TN + u;
#endif
    src.wp[u] = wexp + tile[u] * wtile + 2 * kp0 * 32 + lane;
    src.sp[u] = sexp + tile[u] * stile + kp0 * SW + SLANE(lane);
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
  } else if (!lead_group(tid, lane, warp, q, e, kz, rows_s, ids, ids64, P, top_k, ids_cols, shared_e, pfa, pfb, pfa_bytes,
                         pfb_bytes)) {
    return;
  }
  __syncthreads();
  const int r0 = rows_s[0];
  for (int w = 0; w < NW; ++w) {                 // NW > 1: the walk over this CTA's N tiles
    const int nt = nt0 + w;                   // this trip's N tile
    XRows xs;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      // a row past the group feeds only output columns never stored: read the group's first row
      int p = rows_s[8 * j + g];
      if (p < 0) p = r0;
      const int xr = x_pair ? p : p / top_k;
      xs.row[j] = x + (size_t)xr * K + kp0 * 128 + 16 * t;
    }
    // the weight prologue after the scan: issued before it, the ring's first k-pairs were fetched by
    // CTAs that do not lead too (0-9 % slower on the H200)
    int issued = prologue(wslot0, sslot0, src, kpairs);
    int rslot = 0, wslot = STAGES - 1;
    main_loop(kpairs, wslot0, sslot0, rslot, wslot, issued, src, xs, acc);
    const float* wred = warps_publish(smem, warp, lane, acc);
    const PairRows R = {rows_s, t, g, (size_t)P, tile};
#if NW == 1
    if (warp != 0) return;
    tile_store(wred, R, e, q, nt, kz, lane, acc, y, gscale, gs_stride, routed, tw, top_k, ids_cols, shared_e, ws,
               locks, red, cnt, N);
#else
    if (warp == 0)                                   // the epilogue is warp 0's; the others wait below
      tile_store(wred, R, e, q, nt, kz, lane, acc, y, gscale, gs_stride, routed, tw, top_k, ids_cols, shared_e, ws,
               locks, red, cnt, N);
    if (w + 1 < NW) {                                // the next trip's tile: pointers at K's start, sums zeroed
#pragma unroll
      for (int u = 0; u < TN; ++u) {
        tile[u] += TN;
        src.wp[u] = wexp + tile[u] * wtile + 2 * kp0 * 32 + lane;
        src.sp[u] = sexp + tile[u] * stile + kp0 * SW + SLANE(lane);
#pragma unroll
        for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;
      }
    }
    __syncthreads();                                 // the ring (and the sum's buffer) is the next trip's
#endif
  }
}
