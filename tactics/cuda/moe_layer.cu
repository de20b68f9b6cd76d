// One MoE layer in one launch at small M (M * top_k <= 256 pairs, the shared slot included): w13 with
// SwiGLU into h [P][I] bf16, then w2 with the top_k sum into y [M][H] bf16, CTAs of one grid taking
// either role. The protocol (tickets, per-expert epoch words, the wrap, bounded spins) is specified
// and modelled on the CPU by moe_layer_protocol.py; this text follows its order.
//   ticket  after griddepcontrol.wait, a CTA takes state[TICK]: tickets 0 .. n13 - 1 are w13 roles
//           (pair slot q = t / n13_tiles, N tile t % n13_tiles), the rest w2 roles (token, N tile).
//           w13 roles wait for nothing and are all handed out before any w2 role, so the launch
//           progresses at any residency.
//   w13     moe_mma's direct route with the SwiGLU epilogue: the CTA of pair slot q leads when q's
//           rank among its expert's pairs is a multiple of CAP, gathers the next CAP pairs and stores
//           their h rows; then __threadfence and one arrival on cnt[e] (epoch << 16 | arrivals).
//   w2      moe_tok's token-major formulation: the token's slots one after another through one ring,
//           routing-weighted and summed in registers, one bf16 row slice stored; before reading h it
//           acquires each of its experts' words (ld.acquire, bounded), and reads h with ld.global.cg.
//   done    the last CTA resets the ticket and done words and advances the epoch (clearing every
//           counter at the wrap): nothing on the host changes between graph replays.
// Ids: -1 a slot adding nothing; an id outside [-1, E) makes the token's row NaN and sets `bad`.
// Config (WK, STAGES, TN even; MT 1, SWIGLU 1 for w13's tiles) and the format's macros come as -D
// options; build.text joins the shared parts, moe_common.cuh and tok_slots.cuh (the w2 role's slot
// cursor, moe_tok's) before this file.
#if MT != 1 || !SWIGLU || TN % 2
#error "moe_layer: MT 1, SWIGLU 1 and an even TN (w13's gate and up tiles; w2 reads the same TN rows)"
#endif
#define CAP 8                 // pairs per w13 group (one n8 tile of x rows)
#define MAXK 32               // slots per token (top_k, the shared slot included; tok_slots.cuh)
#define EPOCH_BITS 16
#define EPOCH_MAX 0xFFFF
#define SPIN_BOUND (1 << 22)  // polls before an acquire gives up (ERR_SPIN)
#define ERR_SPIN 1
enum { TICK = 0, DONE = 1, EPOCH = 2, ERR = 3 };   // the state words

static __device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// w13 group rows (MT 1): pair rows_s[2t + (c & 1)] for value c; weight rows of tile u
struct GroupRows {
  const int* rows_s;
  int t;
  __device__ __forceinline__ int row(int, int c) const { return rows_s[2 * t + (c & 1)]; }
  __device__ __forceinline__ bool has(int p) const { return p >= 0; }
};

// warp 0: whether pair q leads a group of expert e (one pass over the P ids, P <= 256); a leader's
// group, the next CAP pairs of e from q, goes to rows_s (-1 past its end)
static __device__ __forceinline__ bool leads(int lane, int q, long long e, int* rows_s, const void* ids, int ids64,
                                             int P, int top_k, int ids_cols, int shared_e) {
  int rank = 0, got = 0;
  for (int j0 = 0; j0 < P; j0 += 32) {
    const int j = j0 + lane;
    const u32 m = __ballot_sync(0xffffffffu, j < P && pair_id(ids, ids64, j, top_k, ids_cols, shared_e) == e);
    rank += __popc(m & (j0 + 32 <= q ? 0xffffffffu : j0 >= q ? 0u : (1u << (q - j0)) - 1u));
    const u32 from = m & (j0 >= q ? 0xffffffffu : j0 + 32 <= q ? 0u : ~((1u << (q - j0)) - 1u));
    const int pos = got + __popc(from & ((1u << lane) - 1u));
    if ((from >> lane & 1u) && pos < CAP) rows_s[pos] = j;
    got += __popc(from);
  }
  if (lane < CAP && lane >= got) rows_s[lane] = -1;
  return rank % CAP == 0;
}

// w13 role, pair slot q and N tile nt: the group's h rows (SwiGLU), published on cnt[e]
static __device__ __forceinline__ void w13_role(unsigned char* smem, int* rows_s, int q, int nt, u32 ep,
                                                const uint4* wq, const u32* sq, const float* gs, int gs_stride,
                                                const u16* x, u16* h, u32* cnt, const void* ids, int ids64, int P,
                                                int top_k, int ids_cols, int shared_e, int n_exp, int H, int I) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const long long e = pair_id(ids, ids64, q, top_k, ids_cols, shared_e);
  if (e < 0 || e >= n_exp) return;               // routed nowhere (w2 reads no h of it; a bad id: its NaN row)
  if (warp == 0) {                               // rows_s[CAP]: whether this CTA leads
    const bool l = leads(lane, q, e, rows_s, ids, ids64, P, top_k, ids_cols, shared_e);
    if (lane == 0) rows_s[CAP] = l;
  }
  __syncthreads();
  if (!rows_s[CAP]) return;
  const int kpairs = H / 128 / WK, kp0 = warp * kpairs;
  const size_t wtile = (size_t)(H / 64) * 32, stile = (size_t)(H / 128) * SW;
  TilePtrs src;
#pragma unroll
  for (int u = 0; u < TN; ++u) {                 // gate tiles, then the matching up tiles I / 16 rows on
    const size_t tile = (size_t)e * (2 * I / 16) + (u < TN / 2 ? 0 : I / 16) + nt * (TN / 2) + u % (TN / 2);
    src.wp[u] = wq + tile * wtile + 2 * kp0 * 32 + lane;
    src.sp[u] = sq + tile * stile + kp0 * SW + SLANE(lane);
  }
  float acc[TN][1][4] = {};
  int p = rows_s[g];                             // a row past the group feeds columns never stored
  if (p < 0) p = rows_s[0];
  XRows xs;
  xs.row[0] = x + (size_t)(p / top_k) * H + kp0 * 128 + 16 * t;
  unsigned char* const wslot0 = smem + tid * 16;
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  int issued = prologue(wslot0, sslot0, src, kpairs), rslot = 0, wslot = STAGES - 1;
  main_loop(kpairs, wslot0, sslot0, rslot, wslot, issued, src, xs, acc);
  const float* wred = warps_publish(smem, warp, lane, acc);
  if (warp != 0) return;
  warps_total(wred, lane, acc);
  const GroupRows R = {rows_s, t};
  epilogue(acc, gs[(size_t)e * gs_stride] * EPI_SCALE, R, [&](int r, int u, int c, float v) {
    store_bf16(h, (size_t)r * I + (nt * OUT_TN + u) * 16 + g + (c >> 1) * 8, v);
  });
  __threadfence();                               // the group's h rows before the arrival
  __syncwarp();
  if (lane == 0) {                               // CAS arrival: a word of another epoch restarts at ep | 1
    u32 old = cnt[e], seen;
    do {
      seen = old;
      const u32 nv = (seen >> EPOCH_BITS) == ep ? seen + 1 : (ep << EPOCH_BITS) | 1u;
      old = atomicCAS(cnt + e, seen, nv);
    } while (old != seen);
  }
}

// warp 0: the token's routed slots (tok_slots.cuh: x row = the pair's h row, expert, scale) and each
// one's expert acquired (its word = ep | need, need = its groups x n13_tiles; bounded). Returns the
// count, -1 for a bad id, -2 for an acquire past its bound (ERR_SPIN recorded)
static __device__ __forceinline__ int w2_slots(int tok, int lane, u32 ep, const u32* cnt, int* state,
                                               const void* ids, int ids64, int P, int top_k, int ids_cols,
                                               int shared_e, int n_exp, int routed, const float* gs, int gs_stride,
                                               const float* tw, int n13_tiles, int* slot_x, int* slot_e,
                                               float* slot_a) {
  const int n = token_slots(tok, lane, ids, ids64, top_k, ids_cols, shared_e, n_exp, 1, routed, gs, gs_stride, tw,
                            slot_x, slot_e, slot_a);
  if (n < 0) return -1;
  __syncwarp();                                  // the slots' experts, written by their lanes
  bool ok = true;
  if (lane < n) {
    const int e = slot_e[lane];
    int pairs = 0;
    for (int j = 0; j < P; ++j) pairs += pair_id(ids, ids64, j, top_k, ids_cols, shared_e) == e;
    const u32 want = (ep << EPOCH_BITS) | (u32)((pairs + CAP - 1) / CAP * n13_tiles);
    int polls = 0;
    while (ld_acquire(cnt + e) != want && (ok = ++polls < SPIN_BOUND)) __nanosleep(64);
    if (!ok) atomicCAS(state + ERR, 0, ERR_SPIN);
  }
  return __all_sync(0xffffffffu, ok) ? n : -2;
}

// w2 role, token tok and N tile nt: its slots' routing-weighted rows summed in registers, one store
static __device__ __forceinline__ void w2_role(unsigned char* smem, int* slot_x, int* slot_e, float* slot_a, int n, int tok, int nt, const uint4* wq, const u32* sq, const u16* h,
                                               u16* y, int* bad, int H, int I) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  if (n == -1) {                                 // a bad id: the token's row NaN, the word set once
    if (nt == 0 && tid == 0) atomicExch(bad, 1);
    for (int c = tid; c < 16 * TN; c += NTHREADS) y[(size_t)tok * H + nt * 16 * TN + c] = (u16)0x7FC0;
    return;
  }
  if (n < 0) return;                             // an acquire past its bound: no row (the error word says so)
  const int kpairs = I / 128 / WK, kp0 = warp * kpairs, total = n * kpairs;
  SlotSrc src = {{}, 0, 0, kpairs, n, H, I, nt, kp0, lane, slot_e, wq, sq};   // N = H, K = I
  if (n > 0) slot_ptrs(wq, sq, slot_e[0], H, I, nt, kp0, lane, src.p.wp, src.p.sp);
  unsigned char* const wslot0 = smem + tid * 16;
  unsigned char* const sslot0 = smem + RING_WBYTES + tid * 4;
  int issued = prologue(wslot0, sslot0, src, total), rslot = 0, wslot = STAGES - 1;
  float acc[TN][1][4] = {}, sum[TN][4] = {};
  SlotX<true> xs = {h + (size_t)(kp0 * 128 + 16 * t), slot_x, slot_a, I, kpairs, 0, 0, sum};   // h from L2
  if (total > 0) main_loop(total, wslot0, sslot0, rslot, wslot, issued, src, xs, acc);
  FOR_VALUES(TN, u, j, c) acc[u][j][c] = sum[u][c];
  const float* wred = warps_publish(smem, warp, lane, acc);   // the warps' sums, in warp order
  if (warp != 0 || t != 0) return;               // column 0 (the token's row): lanes t = 0, values 0 and 2
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const size_t row = (size_t)tok * H + (nt * TN + u) * 16 + g;
    store_bf16(y, row, warps_sum(wred, lane, u, 0, 0));
    store_bf16(y, row + 8, warps_sum(wred, lane, u, 0, 2));
  }
}

// wq13/sq13 [E][2I/16][H/64][32][4] / [E][2I/16][H/128][SW], wq2/sq2 [E][H/16][I/64]... / ...; gs13/gs2 [E]
// (gs_stride 1) or [1]; x [M][H]; y [M][H]; h [P][I] bf16 scratch; ids/tw as moe_tok's; state [4]
// (tick, done, epoch, err) and cnt [n_exp], zeroed once by the launcher before any capture; bad [1]
extern "C" __global__ void __launch_bounds__(NTHREADS) moe_layer(MOE_LAYER_PARAMS) {
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  __shared__ int rows_s[CAP + 1], slot_x[MAXK], slot_e[MAXK], role_s[3];
  __shared__ float slot_a[MAXK];
  const int tid = threadIdx.x, lane = tid & 31;
  const int P = M * top_k, n13 = P * n13_tiles;
  pdl_wait();                                    // the ticket, and every read of inputs, after the wait
  if (tid == 0) {
    role_s[0] = atomicAdd(state + TICK, 1);
    role_s[1] = *reinterpret_cast<volatile int*>(state + EPOCH);
  }
  __syncthreads();
  pdl_release();
  const int tk = role_s[0];
  const u32 ep = (u32)role_s[1];
  if (tk < n13) {
    w13_role(smem, rows_s, tk / n13_tiles, tk % n13_tiles, ep, wq13, sq13, gs13, gs_stride, x, h, cnt, ids, ids64,
             P, top_k, ids_cols, shared_e, n_exp, H, I);
  } else {
    const int tok = (tk - n13) / n2_tiles, nt = (tk - n13) % n2_tiles;
    if (threadIdx.x < 32) {
      const int n = w2_slots(tok, lane, ep, cnt, state, ids, ids64, P, top_k, ids_cols, shared_e, n_exp, routed,
                             gs2, gs_stride, tw, n13_tiles, slot_x, slot_e, slot_a);
      if (lane == 0) role_s[2] = n;
    }
    __syncthreads();
    w2_role(smem, slot_x, slot_e, slot_a, role_s[2], tok, nt, wq2, sq2, h, y, bad, H, I);
  }
  __syncthreads();                               // every thread's stores before the CTA's done arrival
  if (tid != 0) return;
  __threadfence();
  if (atomicAdd(state + DONE, 1) != (int)gridDim.x - 1) return;
  __threadfence();                               // the last CTA: the next launch's words
  const u32 e0 = *reinterpret_cast<volatile u32*>(state + EPOCH);
  if (e0 == EPOCH_MAX)                           // the wrap: no word of an old epoch may match again
    for (int e = 0; e < n_exp; ++e) cnt[e] = 0u;
  state[EPOCH] = e0 == EPOCH_MAX ? 1 : (int)e0 + 1;
  state[TICK] = 0;
  state[DONE] = 0;
  __threadfence();
}
