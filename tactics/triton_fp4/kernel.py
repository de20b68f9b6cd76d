"""Dense W4A16 GEMM in Triton: bf16 x[M, K] · dequant(W_fp4[N, K])ᵀ → bf16 y[M, N].

The weight arrives packed (uint8 [N, K/2], element 2i in the low nibble) with linear block scales
(uint8 [N, K/G]: e4m3 bits for NVFP4, G = 16; e8m0 for MXFP4, G = 32) and an fp32 global scale
read through a pointer (no host sync). The global scale multiplies the fp32 accumulator once.

Dequantization (DEQ_ASM=1, every compiled kernel): one inline-PTX block per 4 packed bytes. A
`prmt` puts byte j in the high byte of 16-bit lane j; two masks and a shift place each nibble's
sign at bit 15 and its 3 exponent/mantissa bits at bf16 bits 6..8, which is the e2m1 value times
2^-126 as a bf16 (the 0.5 code lands on a bf16 subnormal); one `fma.rn.bf16x2` by the block scale
pre-multiplied by 2^SCALE_SHIFT (118 for e4m3, 96 for e8m0; exact, ≤ 6 significant bits) gives
e2m1 · scale · 2^(SHIFT-126), and the epilogue multiplies the fp32 accumulator by
global_scale · 2^(126-SHIFT) once. About 2 integer and ½ bf16x2 instruction per weight element.
DEQ_ASM=0 computes the same function in plain Triton ops (nibbles placed as fp16 bits, since the
interpreter flushes bf16 subnormals): the interpreter cannot run inline PTX, so the CPU tests check
the kernel's tiling, split-K and scale handling through it; the PTX is checked on the GPU.

SPLIT_K > 1 (decode): program (tile, s) reduces K-steps [s·per, (s+1)·per) and stores its fp32
partial tile to a workspace; the last program of a tile to arrive (counted by an acq_rel atomic
per tile) sums the SPLIT_K partials in split order (deterministic), writes bf16 and resets its
counter to 0, so the counters stay zero between launches and the kernel is one launch that CUDA
graphs can capture. The launcher owns the workspace and counters (one launch at a time each).

Specialization contract (compile.py reproduces it): all pointers 16-byte aligned, N and K
multiples of 16 (K a multiple of BLOCK_K), M never specialized.
"""
from __future__ import annotations

import triton
import triton.language as tl

#: positional argument names of the JIT kernel, in order (compile.py builds its signature from it)
ARG_NAMES = ("x_ptr", "w_ptr", "s_ptr", "gs_ptr", "y_ptr", "ws_ptr", "lock_ptr", "M", "N", "K")
ARG_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16",
             "ws_ptr": "*fp32", "lock_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
#: argument positions that carry tt.divisibility 16 (pointers, N, K)
DIVISIBLE = (0, 1, 2, 3, 4, 5, 6, 8, 9)
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "SCALE_GROUP", "SCALE_E4M3",
              "DEQ_ASM", "DOT_F32")

# $0,$1: low-nibble bf16 pairs (bytes 0,1 / 2,3); $2,$3: high-nibble pairs; $4: 4 packed bytes;
# $5,$6: the bf16 block scales (times 2^SCALE_SHIFT) of bytes 0,1 / 2,3.
_DEQ_PTX_TEXT = """
{
.reg .b32 t<2>, u, v, w, nz;
mov.b32 nz, 0x80008000;
prmt.b32 t0, $4, 0, 0x1404;
prmt.b32 t1, $4, 0, 0x3424;
""" + "".join(f"""
shl.b32 u, t{i}, 4;
and.b32 v, u, 0x80008000;
shr.b32 w, u, 6;
and.b32 w, w, 0x01C001C0;
or.b32 v, v, w;
fma.rn.bf16x2 ${i}, v, ${5 + i}, nz;
and.b32 v, t{i}, 0x80008000;
shr.b32 w, t{i}, 6;
and.b32 w, w, 0x01C001C0;
or.b32 v, v, w;
fma.rn.bf16x2 ${2 + i}, v, ${5 + i}, nz;
""" for i in range(2)) + "}"
_DEQ_PTX = tl.constexpr(_DEQ_PTX_TEXT)


@triton.jit
def dequant_tile(p, sc, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_GROUP: tl.constexpr,
                  DEQ_ASM: tl.constexpr):
    """p: uint8 [BN, BK/2] packed codes; sc: bf16 [BN, BK/G] block scales → bf16 [BN, BK]."""
    # the scale of each packed byte (2 elements; G/2 bytes share one scale)
    sb = tl.broadcast_to(sc[:, :, None], (BLOCK_N, BLOCK_K // SCALE_GROUP, SCALE_GROUP // 2))
    sb = sb.reshape(BLOCK_N, BLOCK_K // 2)
    if DEQ_ASM:
        lo, hi = tl.inline_asm_elementwise(_DEQ_PTX, "=r,=r,=r,=r,r,r,r", [p, sb],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        # the same nibble extraction in 16-bit lanes, placed as fp16 bits (value · 2^-14: the
        # interpreter flushes bf16 subnormals, fp16 ones convert exactly), scaled in fp32
        q = p.to(tl.uint16)
        lo_b = ((q & 0x8) << 12) | ((q & 0x7) << 9)
        hi_b = ((q & 0x80) << 8) | ((q & 0x70) << 5)
        sf = sb.to(tl.float32)
        lo = ((lo_b.to(tl.float16, bitcast=True).to(tl.float32) * sf) * 1.925929944387236e-34).to(tl.bfloat16)
        hi = ((hi_b.to(tl.float16, bitcast=True).to(tl.float32) * sf) * 1.925929944387236e-34).to(tl.bfloat16)
    return tl.join(lo, hi).reshape(BLOCK_N, BLOCK_K)


@triton.jit
def scales_bf16(s, SCALE_E4M3: tl.constexpr):
    """Block scale · 2^SCALE_SHIFT as bf16 (exact). The dequantized tile is e2m1 · scale ·
    2^(SCALE_SHIFT - 126): one multiply of the 2^-126-biased code, no overflow in bf16."""
    if SCALE_E4M3:
        # e4m3 (sign ignored) → fp16 bits by a shift (exact, subnormals included) = scale · 2^-8;
        # · 2^126 → scale · 2^118 (≤ 448 · 2^118 < 2^127)
        f = ((s.to(tl.uint16) & 0x7F) << 7).to(tl.float16, bitcast=True).to(tl.float32)
        return (f * 8.507059173023462e37).to(tl.bfloat16)
    else:
        # e8m0 byte e → bf16 2^(e-127+96): the exponent field is e + 96 (scales up to 2^31)
        return ((s.to(tl.uint16) + 96) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def acc_scale(gs_ptr, SCALE_E4M3: tl.constexpr):
    """Global scale times 2^(126 - SCALE_SHIFT), undoing the tile's bias once per output."""
    if SCALE_E4M3:
        return tl.load(gs_ptr) * 256.0
    else:
        return tl.load(gs_ptr) * 1073741824.0


@triton.jit
def k_steps(x_ptrs, w_ptrs, s_ptrs, k0, k1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SCALE_GROUP: tl.constexpr, SCALE_E4M3: tl.constexpr, DEQ_ASM: tl.constexpr, DOT_F32: tl.constexpr):
    """acc[BLOCK_M, BLOCK_N] (fp32) = Σ over K steps k0..k1 of x-tile · dequant(W-tile)ᵀ, the pointers
    at step k0: the main loop every W4A16 kernel shares (inlined by Triton, so each kernel still
    pipelines it with its own num_stages)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(k0, k1):
        a = tl.load(x_ptrs)
        p = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
        w = dequant_tile(p, scales_bf16(s, SCALE_E4M3), BLOCK_N, BLOCK_K, SCALE_GROUP, DEQ_ASM)
        if DOT_F32:
            # TRITON_INTERPRET=1 only: Triton 3.9's interpreter computes bf16 tl.dot (and bf16
            # arithmetic) on the raw uint16 bits; the bf16 operands are widened exactly to fp32
            acc = tl.dot(a.to(tl.float32), tl.trans(w).to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
        s_ptrs += BLOCK_K // SCALE_GROUP
    return acc


@triton.jit(do_not_specialize=["M"])
def w4a16_dequant_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, ws_ptr, lock_ptr, M, N, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SCALE_GROUP: tl.constexpr,
                         SCALE_E4M3: tl.constexpr, DEQ_ASM: tl.constexpr, DOT_F32: tl.constexpr = 0):
    # grouped ordering: GROUP_M row-blocks share each column block while it is hot in L2
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows past M / N read a valid row (wrap) so the loads need no mask; the store is masked
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_kp = tl.arange(0, BLOCK_K // 2)
    offs_ks = tl.arange(0, BLOCK_K // SCALE_GROUP)

    # BLOCK_K divides K, so the row strides of the packed weight and of the scales are multiples
    # of their per-tile widths: telling the compiler lets it vectorize (and cp.async-pipeline) them
    KP = tl.multiple_of(K // 2, BLOCK_K // 2)
    KS = tl.multiple_of(K // SCALE_GROUP, BLOCK_K // SCALE_GROUP)
    n_steps = K // BLOCK_K
    per = tl.cdiv(n_steps, SPLIT_K)
    k0 = pid_k * per
    k1 = min(k0 + per, n_steps)
    x_ptrs = x_ptr + offs_am[:, None] * K + (k0 * BLOCK_K + offs_k)[None, :]
    w_ptrs = w_ptr + offs_bn[:, None] * KP + (k0 * (BLOCK_K // 2) + offs_kp)[None, :]
    s_ptrs = s_ptr + offs_bn[:, None] * KS + (k0 * (BLOCK_K // SCALE_GROUP) + offs_ks)[None, :]

    acc = k_steps(x_ptrs, w_ptrs, s_ptrs, k0, k1, BLOCK_M, BLOCK_N, BLOCK_K, SCALE_GROUP, SCALE_E4M3, DEQ_ASM,
                  DOT_F32)

    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    y_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    if SPLIT_K == 1:
        acc = acc * acc_scale(gs_ptr, SCALE_E4M3)
        tl.store(y_ptrs, acc.to(tl.bfloat16), mask=y_mask)
    else:
        n_tiles = num_pid_m * num_pid_n
        part = ws_ptr + pid.to(tl.int64) * (BLOCK_M * BLOCK_N) + tile
        tl.store(part + (pid_k * n_tiles).to(tl.int64) * (BLOCK_M * BLOCK_N), acc)
        # every thread's partial is stored before one thread's release below
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            tot = tl.zeros(acc.shape, dtype=tl.float32)
            for s in range(SPLIT_K):
                # .cg: read from L2, where the other programs' partials are
                tot += tl.load(part + (s * n_tiles).to(tl.int64) * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
            tot = tot * acc_scale(gs_ptr, SCALE_E4M3)
            tl.store(y_ptrs, tot.to(tl.bfloat16), mask=y_mask)
            tl.atomic_xchg(lock_ptr + pid, 0)


@triton.jit
def dequant_bf16_kernel(w_ptr, s_ptr, gs_ptr, out_ptr, N, K,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_GROUP: tl.constexpr,
                        SCALE_E4M3: tl.constexpr, DEQ_ASM: tl.constexpr):
    """out[N, K] (bf16) = dequant(W) · global_scale: the first half of the dequant-then-cuBLAS tactic."""
    pn = tl.program_id(0)
    pk = tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    KP = tl.multiple_of(K // 2, BLOCK_K // 2)
    KS = tl.multiple_of(K // SCALE_GROUP, BLOCK_K // SCALE_GROUP)
    p = tl.load(w_ptr + rows[:, None] * KP + (pk * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2))[None, :])
    s = tl.load(s_ptr + rows[:, None] * KS + (pk * (BLOCK_K // SCALE_GROUP) + tl.arange(0, BLOCK_K // SCALE_GROUP))[None, :])
    w = dequant_tile(p, scales_bf16(s, SCALE_E4M3), BLOCK_N, BLOCK_K, SCALE_GROUP, DEQ_ASM)
    w = (w.to(tl.float32) * acc_scale(gs_ptr, SCALE_E4M3)).to(tl.bfloat16)
    offs_k = pk * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], w, mask=(offs_n[:, None] < N))


#: positional arguments of the grouped-MoE kernel (compile.py builds its signature from them)
MOE_ARG_NAMES = ("x_ptr", "w_ptr", "s_ptr", "gs_ptr", "y_ptr", "sorted_ptr", "expert_ptr", "npad_ptr",
                 "tw_ptr", "P", "N", "K")
MOE_ARG_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16",
                 "sorted_ptr": "*i32", "expert_ptr": "*i32", "npad_ptr": "*i32", "tw_ptr": "*fp32",
                 "P": "i32", "N": "i32", "K": "i32"}
MOE_DIVISIBLE = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11)
MOE_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "TOP_K", "SCALE_GROUP", "SCALE_E4M3", "ROUTED_WEIGHT",
                  "DEQ_ASM", "DOT_F32")


@triton.jit(do_not_specialize=["P"])
def moe_w4a16_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, sorted_ptr, expert_ptr, npad_ptr, tw_ptr, P, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TOP_K: tl.constexpr,
                     SCALE_GROUP: tl.constexpr, SCALE_E4M3: tl.constexpr, ROUTED_WEIGHT: tl.constexpr,
                     DEQ_ASM: tl.constexpr, DOT_F32: tl.constexpr = 0):
    """Grouped MoE GEMM: (token, slot) pairs sorted by expert, each expert's run padded to BLOCK_M
    (sorted_ptr holds pair ids, P marks padding; expert_ptr one expert per row block; npad_ptr the
    padded total). y[pair] = (x[pair // TOP_K] · dequant(W[e])ᵀ) · routed weight, rows [P, N]."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    live = pairs < P
    rows = tl.where(live, pairs // TOP_K, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    KP = tl.multiple_of(K // 2, BLOCK_K // 2)
    KS = tl.multiple_of(K // SCALE_GROUP, BLOCK_K // SCALE_GROUP)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * K + offs_k[None, :]
    w_ptrs = (w_ptr + e * N * KP) + offs_bn[:, None] * KP + tl.arange(0, BLOCK_K // 2)[None, :]
    s_ptrs = (s_ptr + e * N * KS) + offs_bn[:, None] * KS + tl.arange(0, BLOCK_K // SCALE_GROUP)[None, :]
    # padding rows read token 0: valid memory, never stored
    acc = k_steps(x_ptrs, w_ptrs, s_ptrs, 0, K // BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K, SCALE_GROUP, SCALE_E4M3,
                  DEQ_ASM, DOT_F32)
    acc = acc * acc_scale(gs_ptr + e, SCALE_E4M3)     # one global scale per expert
    if ROUTED_WEIGHT:
        acc = acc * tl.load(tw_ptr + pairs, mask=live, other=0.0)[:, None]
    y_ptrs = y_ptr + pairs.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(tl.bfloat16), mask=live[:, None] & (offs_n[None, :] < N))
