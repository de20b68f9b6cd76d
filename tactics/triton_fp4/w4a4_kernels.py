"""W4A4 Triton kernels: activation quantization (bf16 → packed e2m1 + block scales) and the
two-FP4-operand `tl.dot_scaled` GEMM. Imported only when a W4A4 kernel runs or compiles (the
family's verdicts never import Triton); the member itself lives in w4a4.py.

Activation quantization reproduces autotune/formats.py bit for bit:
* NVFP4 (`quantize_activation_nvfp4`): per 16 elements, s = amax / (6·input_scale) (zero block →
  1.0), clamped to [2^-9, 448] and rounded to e4m3 (round to nearest even, done here with integer
  ops on the fp32 bits so every target — and the interpreter — rounds identically); elements
  x / (s_e4m3 · input_scale) → e2m1 with ModelOpt's bounds (ties to the even mantissa).
* MXFP4 (`quantize(x, "mxfp4")`): per 32 elements, e = ceil(log2(amax/6)) from the fp32 bits of
  amax (= formats._e8m0_block_scales' frexp rule), clamped at -127, stored as e + 127; elements
  x / 2^e → e2m1.
Divisions use `div_rn` (IEEE round to nearest; Triton's `/` on fp32 is an approximate division on
NVIDIA targets). Packing: element 2i in the low nibble.

The GEMM: y = (dot_scaled(x_q, x_s, W_q, W_s) · input_scale · weight_global_scale) → bf16.
Specialization contract (w4a4.py's cross-compile reproduces it): pointers 16-byte aligned, N and K
multiples of 16, K a multiple of BLOCK_K, M never specialized; rows past M / N wrap for the loads.
"""
from __future__ import annotations

import triton
import triton.language as tl

#: GEMM positional arguments, in order; scale pointers are *fp8e4nv (NVFP4) or *u8 (MXFP4)
GEMM_ARG_NAMES = ("xq_ptr", "xs_ptr", "w_ptr", "ws_ptr", "ags_ptr", "wgs_ptr", "y_ptr", "M", "N", "K")
GEMM_DIVISIBLE = (0, 1, 2, 3, 4, 5, 6, 8, 9)


def gemm_arg_types(fmt: str) -> dict[str, str]:
    s = "*fp8e4nv" if fmt == "nvfp4" else "*u8"
    return {"xq_ptr": "*u8", "xs_ptr": s, "w_ptr": "*u8", "ws_ptr": s, "ags_ptr": "*fp32", "wgs_ptr": "*fp32",
            "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}


QUANT_ARG_NAMES = ("x_ptr", "q_ptr", "s_ptr", "gs_ptr", "M", "K")
QUANT_ARG_TYPES = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "M": "i32", "K": "i32"}
QUANT_DIVISIBLE = (0, 1, 2, 3, 5)


@triton.jit
def e4m3_rne(s):
    """s: fp32 in [2^-9, 448] → (e4m3 byte as uint32, its exact fp32 value), round to nearest even."""
    b = s.to(tl.uint32, bitcast=True)
    e = (b >> 23).to(tl.int32) - 127
    # mantissa bits kept: 3 for normals (e ≥ -6); subnormals have spacing 2^-9 → e + 9 bits
    keep = tl.where(e >= -6, 3, e + 9)
    shift = (23 - keep).to(tl.uint32)
    one = tl.full(b.shape, 1, tl.uint32)
    half_m1 = (one << (shift - 1)) - 1
    # ties to even: the parity of the kept value (with no mantissa bit kept, e = -9, it is the
    # implicit 1: m = 1 is odd)
    odd = tl.where(keep == 0, one, (b >> shift) & 1)
    r = (b + half_m1 + odd) & ~((one << shift) - 1)
    rv = r.to(tl.float32, bitcast=True)
    re = (r >> 23).to(tl.int32) - 127
    normal = ((((r >> 23) - 120) << 3) | ((r >> 20) & 7))
    # subnormal: value = m · 2^-9, m = 1.f · 2^(re + 9) ∈ 1..7 (a carry to 8 is the normal 0x08)
    sub = ((r & 0x7FFFFF) | 0x800000) >> (23 - (re + 9)).to(tl.uint32)
    return tl.where(re >= -6, normal, sub), rv


@triton.jit
def _e2m1_codes(q):
    """ModelOpt `_cast_fp4` on fp32 q: bounds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 with ties to the
    even mantissa (on 0.75, 1.75, 3.5 up, else down), saturating at 6; sign bit from q < 0."""
    a = tl.abs(q)
    mag = ((a > 0.25).to(tl.uint8) + (a >= 0.75).to(tl.uint8) + (a > 1.25).to(tl.uint8)
           + (a >= 1.75).to(tl.uint8) + (a > 2.5).to(tl.uint8) + (a >= 3.5).to(tl.uint8)
           + (a > 5.0).to(tl.uint8))
    return mag | ((q < 0).to(tl.uint8) << 3)


@triton.jit(do_not_specialize=["M"])
def act_quant_kernel(x_ptr, q_ptr, s_ptr, gs_ptr, M, K,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_GROUP: tl.constexpr,
                     SCALE_E4M3: tl.constexpr):
    """x bf16 [M, K] → q uint8 [M, K/2] (packed e2m1), s uint8 [M, K/G] (e4m3 or e8m0 bytes)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = offs_m < M
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    xb = x.to(tl.float32).reshape(BLOCK_M, BLOCK_K // SCALE_GROUP, SCALE_GROUP)
    amax = tl.max(tl.abs(xb), axis=2)
    if SCALE_E4M3:
        gs = tl.load(gs_ptr)
        s = tl.math.div_rn(amax, gs * 6.0)
        s = tl.where(amax == 0.0, 1.0, s)
        s = tl.minimum(tl.maximum(s, 0.001953125), 448.0)
        byte, sv = e4m3_rne(s)
        denom = sv * gs
    else:
        ab = amax.to(tl.uint32, bitcast=True)
        ef = (ab >> 23).to(tl.int32)
        e = ef - 1 - ((ab & 0x7FFFFF) <= 0x400000).to(tl.int32)
        byte = tl.where(ef > 0, tl.maximum(e, 0), 0).to(tl.uint32)
        # 2^(byte - 127) as fp32; byte 0 is the subnormal 2^-127
        denom = tl.where(byte > 0, byte << 23, 0x400000).to(tl.float32, bitcast=True)
    q = tl.math.div_rn(xb, denom[:, :, None])
    codes = _e2m1_codes(q).reshape(BLOCK_M, BLOCK_K // 2, 2)
    lo, hi = tl.split(codes)
    packed = lo | (hi << 4)
    KP = K // 2
    KS = K // SCALE_GROUP
    offs_kp = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    offs_ks = pid_k * (BLOCK_K // SCALE_GROUP) + tl.arange(0, BLOCK_K // SCALE_GROUP)
    tl.store(q_ptr + offs_m.to(tl.int64)[:, None] * KP + offs_kp[None, :], packed, mask=rows[:, None])
    tl.store(s_ptr + offs_m.to(tl.int64)[:, None] * KS + offs_ks[None, :], byte.to(tl.uint8), mask=rows[:, None])


@triton.jit(do_not_specialize=["M"])
def w4a4_gemm_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, ags_ptr, wgs_ptr, y_ptr, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, SCALE_GROUP: tl.constexpr):
    """y[M, N] = (x_q · W_qᵀ with both block scales) · input_scale · weight_global_scale."""
    pid = tl.program_id(0)
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
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    KP = tl.multiple_of(K // 2, BLOCK_K // 2)
    KS = tl.multiple_of(K // SCALE_GROUP, BLOCK_K // SCALE_GROUP)
    kp = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // SCALE_GROUP)
    a_ptrs = xq_ptr + offs_am.to(tl.int64)[:, None] * KP + kp[None, :]          # [BM, BK/2]
    as_ptrs = xs_ptr + offs_am.to(tl.int64)[:, None] * KS + ks[None, :]         # [BM, BK/G]
    b_ptrs = w_ptr + offs_bn.to(tl.int64)[None, :] * KP + kp[:, None]           # [BK/2, BN]
    bs_ptrs = ws_ptr + offs_bn.to(tl.int64)[:, None] * KS + ks[None, :]         # [BN, BK/G]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        a = tl.load(a_ptrs)
        sa = tl.load(as_ptrs)
        b = tl.load(b_ptrs)
        sb = tl.load(bs_ptrs)
        acc = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)
        a_ptrs += BLOCK_K // 2
        b_ptrs += BLOCK_K // 2
        as_ptrs += BLOCK_K // SCALE_GROUP
        bs_ptrs += BLOCK_K // SCALE_GROUP
    acc = acc * (tl.load(ags_ptr) * tl.load(wgs_ptr))
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(tl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
