"""Decode-shaped grouped MoE GEMM in Triton: bf16 x[M, K] · dequant(W_fp4[E, N, K])ᵀ over the routed
(token, slot) pairs, output rows [P = M·top_k, N] (or [P, N/2] with the SwiGLU epilogue). x holds one row per token, or
one per pair with X_PAIR (w2: each slot's own activation, [M, top_k, K]).

Grid (G · N/BLOCK_N, SPLIT_K) over row groups G, N tiles and K splits. A row group is up to BLOCK_M
pairs routed to one expert:

* ALIGNED = 0 ("direct", small M·top_k): reads topk_ids as they are, no alignment. Group g is
  pair g; it leads (does the work) when its rank among the pairs routed to its expert, counted in
  pair order, is a multiple of BLOCK_M, and it then gathers the next BLOCK_M pairs of that expert.
  Every other program exits after scanning ≤ P ids, so M = 1 with top-8 runs 8 groups of 1 row:
  no 16-row padding of the pair count and no torch ops.
* ALIGNED = 1: groups are the row blocks of moe_align (sorted pair ids, one expert per block).

The G_MAIN groups above are followed by ⌈P/BLOCK_M⌉ groups that write the rows of pairs routed
nowhere: zeros for id -1 (expert not on this rank: no work), NaN for an id outside [-1, E) (and the
sticky `bad` word is set), so an invalid id can never yield a plausible row.

SPLIT_K > 1: each program stores its fp32 partial rows to a workspace [SPLIT_K, P, N]; the last of
a group tile's programs to arrive (acq_rel counter per (group, N tile), after a CTA barrier) sums
the partials in split order (deterministic), runs the epilogue and resets the counter: one
launch, no memset, graph-capturable (the dense member's scheme, kernel.py).

SWIGLU = 1 (w13 with vLLM's [gate; up] rows): an N tile interleaves gate rows n and up rows
N/2 + n, so each thread's accumulator holds (gate, up) pairs of adjacent columns; the epilogue
writes silu(gate)·up, BLOCK_N/2 columns of the [P, N/2] output.

REDUCE = 1 (w2 with the routing weights applied and the top_k slots summed, output [M, N]): each
pair's final fp32 row goes to a buffer [P, N]; a counter per (token, N tile) counts the token's
slots (pairs routed nowhere count too, as zero rows); the program that brings the last one sums
the token's TOP_K rows in slot order (deterministic) and resets the counter. The main loop is kernel.py's
(dequantization helpers imported from there); only the row offsets and the epilogue differ.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernel import acc_scale, k_steps

#: positional arguments of the JIT kernel, in order (the cross-compile signature is built from them)
ARG_NAMES = ("x_ptr", "w_ptr", "s_ptr", "gs_ptr", "y_ptr", "ids_ptr", "sorted_ptr", "expert_ptr", "tw_ptr",
             "ws_ptr", "lock_ptr", "bad_ptr", "red_ptr", "cnt_ptr", "P", "G_MAIN", "N", "K")
ARG_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16",
             "ids_ptr": "*i32", "sorted_ptr": "*i32", "expert_ptr": "*i32", "tw_ptr": "*fp32",
             "ws_ptr": "*fp32", "lock_ptr": "*i32", "bad_ptr": "*i32", "red_ptr": "*fp32", "cnt_ptr": "*i32", "P": "i32", "G_MAIN": "i32",
             "N": "i32", "K": "i32"}
#: argument positions with tt.divisibility 16: every pointer, N and K (P, G_MAIN are not specialized)
DIVISIBLE = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17)
#: ids scanned per step in direct mode
SCAN = 64


@triton.jit
def _reduce_rows(v, pairs, live, y_ptr, red_ptr, cnt_ptr, pid_n, num_pid_n, N, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, TOP_K: tl.constexpr):
    """REDUCE epilogue: store the pairs' fp32 rows, count one arrival per (token, N tile); the
    program that brings a token's last slot sums its TOP_K rows in slot order (deterministic),
    writes y[token] and resets the counter."""
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(red_ptr + pairs.to(tl.int64)[:, None] * N + cols[None, :], v, mask=live[:, None])
    tl.debug_barrier()
    tok = tl.where(live, pairs // TOP_K, 0)
    cnt = cnt_ptr + tok * num_pid_n + pid_n
    arrived = tl.atomic_add(cnt, tl.full([BLOCK_M], 1, tl.int32), mask=live, sem="acq_rel")
    last = live & (arrived == TOP_K - 1)
    tl.debug_barrier()
    tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(TOP_K):
        src = red_ptr + (tok * TOP_K + s).to(tl.int64)[:, None] * N + cols[None, :]
        tot += tl.load(src, mask=last[:, None], other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + tok.to(tl.int64)[:, None] * N + cols[None, :], tot.to(tl.bfloat16), mask=last[:, None])
    tl.atomic_xchg(cnt, tl.zeros([BLOCK_M], dtype=tl.int32), mask=last)


@triton.jit
def _special_rows(y_ptr, ids_ptr, bad_ptr, red_ptr, cnt_ptr, q0, pid_n, num_pid_n, P, N, N_OUT,
                  BLOCK_M: tl.constexpr, OUT_BN: tl.constexpr, NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
                  REDUCE: tl.constexpr):
    """Rows of pairs [q0, q0 + BLOCK_M) that no expert computes: 0 for id -1, NaN for a bad id
    (with REDUCE, those rows are the pairs' contributions to their token's sum)."""
    q = q0 + tl.arange(0, BLOCK_M)
    inq = q < P
    qe = tl.load(ids_ptr + q, mask=inq, other=0).to(tl.int32)
    zero = inq & (qe == -1)
    bad = inq & ((qe < -1) | (qe >= NUM_EXPERTS))
    cols = pid_n * OUT_BN + tl.arange(0, OUT_BN)
    val = tl.where(bad, float("nan"), 0.0)[:, None] + tl.zeros([BLOCK_M, OUT_BN], dtype=tl.float32)
    if REDUCE:
        _reduce_rows(val, q, zero | bad, y_ptr, red_ptr, cnt_ptr, pid_n, num_pid_n, N, BLOCK_M, OUT_BN, TOP_K)
    else:
        tl.store(y_ptr + q.to(tl.int64)[:, None] * N_OUT + cols[None, :], val.to(tl.bfloat16),
                 mask=(zero | bad)[:, None])
    if tl.sum(bad.to(tl.int32), axis=0) > 0:
        tl.store(bad_ptr, 1)


@triton.jit
def _direct_group(ids_ptr, g, P, BLOCK_M: tl.constexpr, SCAN_W: tl.constexpr, NUM_EXPERTS: tl.constexpr):
    """Direct mode: (expert, lead, pairs[BLOCK_M]) of pair g's group; pairs past the group are P."""
    e = tl.load(ids_ptr + g).to(tl.int32)
    rank = 0
    for j0 in range(0, g, SCAN_W):
        jj = j0 + tl.arange(0, SCAN_W)
        v = tl.load(ids_ptr + jj, mask=jj < g, other=-1).to(tl.int32)
        rank += tl.sum((v == e).to(tl.int32), axis=0)
    lead = (e >= 0) & (e < NUM_EXPERTS) & (rank % BLOCK_M == 0)
    pairs = tl.full([BLOCK_M], 0, tl.int32) + P
    if lead:
        r = tl.arange(0, BLOCK_M)
        run = 0
        for j0 in range(g, P, SCAN_W):
            jj = j0 + tl.arange(0, SCAN_W)
            v = tl.load(ids_ptr + jj, mask=jj < P, other=-1).to(tl.int32)
            m = v == e
            pos = tl.cumsum(m.to(tl.int32), axis=0) + run - 1
            sel = m[None, :] & (pos[None, :] == r[:, None])
            got = tl.sum(tl.where(sel, jj[None, :], 0), axis=1)
            pairs = tl.where(tl.sum(sel.to(tl.int32), axis=1) > 0, got, pairs)
            run += tl.sum(m.to(tl.int32), axis=0)
    return e, lead, pairs


@triton.jit
def _epilogue(acc, y_ptr, tw_ptr, red_ptr, cnt_ptr, pairs, live, pid_n, num_pid_n, N, N_OUT, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, TOP_K: tl.constexpr, SWIGLU: tl.constexpr, REDUCE: tl.constexpr,
              ROUTED_WEIGHT: tl.constexpr):
    """acc: the scaled fp32 rows [BLOCK_M, BLOCK_N] of this tile → bf16 output rows."""
    if SWIGLU:
        gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N // 2, 2]))
        v = gate * tl.sigmoid(gate) * up
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    else:
        v = acc
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if ROUTED_WEIGHT:
        v = v * tl.load(tw_ptr + pairs, mask=live, other=0.0)[:, None]
    if REDUCE:
        _reduce_rows(v, pairs, live, y_ptr, red_ptr, cnt_ptr, pid_n, num_pid_n, N, BLOCK_M, BLOCK_N, TOP_K)
    else:
        tl.store(y_ptr + pairs.to(tl.int64)[:, None] * N_OUT + cols[None, :], v.to(tl.bfloat16),
                 mask=live[:, None])


@triton.jit(do_not_specialize=["P", "G_MAIN"])
def moe_decode_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, ids_ptr, sorted_ptr, expert_ptr, tw_ptr, ws_ptr,
                      lock_ptr, bad_ptr, red_ptr, cnt_ptr, P, G_MAIN, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, NUM_EXPERTS: tl.constexpr,
                      SCALE_GROUP: tl.constexpr, SCALE_E4M3: tl.constexpr, GS_STRIDE: tl.constexpr,
                      ALIGNED: tl.constexpr, X_PAIR: tl.constexpr,
                      SWIGLU: tl.constexpr, REDUCE: tl.constexpr, ROUTED_WEIGHT: tl.constexpr, SCAN_W: tl.constexpr,
                      DEQ_ASM: tl.constexpr, DOT_F32: tl.constexpr = 0):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = N // BLOCK_N
    g = pid // num_pid_n
    pid_n = pid % num_pid_n
    N_OUT = N // (1 + SWIGLU)
    if g >= G_MAIN:
        if pid_k == 0:
            _special_rows(y_ptr, ids_ptr, bad_ptr, red_ptr, cnt_ptr, (g - G_MAIN) * BLOCK_M, pid_n, num_pid_n, P, N,
                          N_OUT, BLOCK_M, BLOCK_N // (1 + SWIGLU), NUM_EXPERTS, TOP_K, REDUCE)
    else:
        if ALIGNED:
            e = tl.load(expert_ptr + g)
            lead = e >= 0
            pairs = tl.load(sorted_ptr + g * BLOCK_M + tl.arange(0, BLOCK_M))
        else:
            e, lead, pairs = _direct_group(ids_ptr, g, P, BLOCK_M, SCAN_W, NUM_EXPERTS)
        if lead:
            live = pairs < P
            # x row: the token's (X_PAIR = 0) or the pair's own (X_PAIR = 1: w2 reads each slot's
            # activation); padding rows read row 0, never stored
            rows = tl.where(live, pairs // (1 if X_PAIR else TOP_K), 0)
            e64 = e.to(tl.int64)
            c = tl.arange(0, BLOCK_N)
            if SWIGLU:
                # gate row n and up row N/2 + n side by side: (gate, up) land in adjacent columns
                h = N // 2
                offs_bn = tl.where(c % 2 == 0, 0, h) + pid_n * (BLOCK_N // 2) + c // 2
            else:
                offs_bn = tl.max_contiguous(tl.multiple_of(pid_n * BLOCK_N + c, BLOCK_N), BLOCK_N)
            KP = tl.multiple_of(K // 2, BLOCK_K // 2)
            KS = tl.multiple_of(K // SCALE_GROUP, BLOCK_K // SCALE_GROUP)
            n_steps = K // BLOCK_K
            per = tl.cdiv(n_steps, SPLIT_K)
            k0 = pid_k * per
            k1 = min(k0 + per, n_steps)
            x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * K + (k0 * BLOCK_K + tl.arange(0, BLOCK_K))[None, :]
            w_ptrs = (w_ptr + e64 * N * KP) + offs_bn[:, None] * KP + \
                (k0 * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2))[None, :]
            s_ptrs = (s_ptr + e64 * N * KS) + offs_bn[:, None] * KS + \
                (k0 * (BLOCK_K // SCALE_GROUP) + tl.arange(0, BLOCK_K // SCALE_GROUP))[None, :]
            acc = k_steps(x_ptrs, w_ptrs, s_ptrs, k0, k1, BLOCK_M, BLOCK_N, BLOCK_K, SCALE_GROUP, SCALE_E4M3,
                          DEQ_ASM, DOT_F32)
            scale = acc_scale(gs_ptr + e64 * GS_STRIDE, SCALE_E4M3)    # GS_STRIDE 0: one global scale
            if SPLIT_K == 1:
                _epilogue(acc * scale, y_ptr, tw_ptr, red_ptr, cnt_ptr, pairs, live, pid_n, num_pid_n, N, N_OUT,
                          BLOCK_M, BLOCK_N, TOP_K, SWIGLU, REDUCE, ROUTED_WEIGHT)
            else:
                wcols = pid_n * BLOCK_N + c
                part = ws_ptr + pairs.to(tl.int64)[:, None] * N + wcols[None, :]
                tl.store(part + (pid_k * P).to(tl.int64) * N, acc, mask=live[:, None])
                # every thread's partial is stored before one thread's release below
                tl.debug_barrier()
                lock = lock_ptr + g * num_pid_n + pid_n
                arrived = tl.atomic_add(lock, 1, sem="acq_rel")
                if arrived == SPLIT_K - 1:
                    tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for sk in range(SPLIT_K):
                        # .cg: read from L2, where the other programs' partials are
                        tot += tl.load(part + (sk * P).to(tl.int64) * N, mask=live[:, None], other=0.0,
                                       cache_modifier=".cg")
                    _epilogue(tot * scale, y_ptr, tw_ptr, red_ptr, cnt_ptr, pairs, live, pid_n, num_pid_n, N, N_OUT,
                              BLOCK_M, BLOCK_N, TOP_K, SWIGLU, REDUCE, ROUTED_WEIGHT)
                    tl.atomic_xchg(lock, 0)
