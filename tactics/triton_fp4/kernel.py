"""Dense W4A16 GEMM in Triton: bf16 x[M, K] · dequant(W_fp4[N, K])ᵀ → bf16 y[M, N].

The weight arrives packed (uint8 [N, K/2], element 2i in the low nibble) with linear block scales
(uint8 [N, K/G]: e4m3 bits for NVFP4, G = 16; e8m0 for MXFP4, G = 32) and an fp32 global scale
read through a pointer (no host sync). Each K step loads the packed tile with 16-byte vector loads,
splits the two nibbles and interleaves them (tl.join + reshape), decodes e2m1 → bf16 with integer
bit operations (exact), multiplies by the block scale in fp32 and rounds to bf16 once (exact: ≤ 6 significant bits) and
feeds `tl.dot` with an fp32 accumulator. The global scale multiplies the accumulator once.

Both scale formats are read as uint8 and decoded with bit operations, so the kernel compiles on
every target (a `*fp8e4nv` pointer would not compile for sm80/sm86).

Specialization contract (the cross-compiler in compile.py reproduces it): all pointers 16-byte
aligned, N and K multiples of 16 (K a multiple of BLOCK_K), M never specialized.
"""
from __future__ import annotations

import triton
import triton.language as tl

#: positional argument names of the JIT kernel, in order (compile.py builds its signature from it)
ARG_NAMES = ("x_ptr", "w_ptr", "s_ptr", "gs_ptr", "y_ptr", "M", "N", "K")
ARG_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16",
             "M": "i32", "N": "i32", "K": "i32"}
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SCALE_GROUP", "SCALE_E4M3", "DOT_F32")


@triton.jit(do_not_specialize=["M"])
def w4a16_dequant_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, y_ptr, M, N, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, SCALE_GROUP: tl.constexpr, SCALE_E4M3: tl.constexpr,
                         DOT_F32: tl.constexpr = 0):
    # grouped ordering: GROUP_M row-blocks share each column block while it is hot in L2
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
    x_ptrs = x_ptr + offs_am[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_bn[:, None] * KP + offs_kp[None, :]
    s_ptrs = s_ptr + offs_bn[:, None] * KS + offs_ks[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(x_ptrs)
        p = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
        # unpack: low nibble = even element, high nibble = odd element
        q = tl.join(p & 0xF, p >> 4).reshape(BLOCK_N, BLOCK_K).to(tl.uint16)
        # e2m1 → bf16 bits: em = code & 7; 0 → 0, 1 → 0.5 (0x3F00), else exponent rebias (+126)
        em = q & 7
        mag = tl.where(em < 2, em * 0x3F00, (em << 6) + (126 << 7))
        wb = (mag | ((q & 8) << 12)).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        if SCALE_E4M3:
            # e4m3 (sign ignored) → fp16 bits by a shift (exact, subnormals included), × 2^8 later
            sc = (((s.to(tl.uint16) & 0x7F) << 7).to(tl.float16, bitcast=True).to(tl.float32) * 256.0)
        else:
            # e8m0 → fp32 2^(e-127)
            sc = (s.to(tl.uint32) << 23).to(tl.float32, bitcast=True)
        # scale in fp32, round to bf16 once (exact: ≤ 6 significant bits)
        w = (wb.to(tl.float32).reshape(BLOCK_N, BLOCK_K // SCALE_GROUP, SCALE_GROUP) * sc[:, :, None])
        w = w.reshape(BLOCK_N, BLOCK_K).to(tl.bfloat16)
        if DOT_F32:
            # TRITON_INTERPRET=1 only: Triton 3.9's interpreter computes bf16 tl.dot (and bf16
            # arithmetic) on the raw uint16 bits; the bf16 operands are widened exactly to fp32
            acc = tl.dot(a.to(tl.float32), tl.trans(w).to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
        s_ptrs += BLOCK_K // SCALE_GROUP

    acc = acc * tl.load(gs_ptr)
    y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(tl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
