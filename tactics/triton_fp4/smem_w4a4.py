"""Static model of `metadata.shared` and tensor memory for the W4A4 GEMM of member `w4a4_dot_scaled`
(w4a4_kernels.w4a4_gemm_kernel: tl.dot_scaled with two packed e2m1 operands).

Fitted on Triton 3.9.0 by cross-compiling the member's whole default space (126 configs × 2
formats) for sm89, sm90, sm100, sm120 and sm121 (2026-11-29; docs/triton-fp4.md, W4A4;
re-checked by `python3 -m tools.triton_smem.w4a4_sweep`).
Tiles (bytes), G = 16 (NVFP4) or 32 (MXFP4), T = 32·num_warps threads:
    X = BM·BK/2, W = BN·BK/2 (packed e2m1), SA = BM·BK/G, SB = BN·BK/G (scales)
A scale tile is cp.async-pipelined when each thread copies ≥ 4 bytes (S ≥ 4T); on sm12x also when
it is at most half a byte per thread (S ≤ T/2: a few threads copy whole 4-byte rows), which
elsewhere costs no shared memory at all; in between it is a plain load whose layout conversion
needs S bytes of scratch (the larger tile's when both are).
"""
from __future__ import annotations

from typing import Any, Mapping

from .member import GROUP
from .smem import cc


def tiles(params: Mapping[str, Any], fmt: str) -> tuple[int, int, int, int]:
    bm, bn, bk = int(params["block_m"]), int(params["block_n"]), int(params["block_k"])
    g = GROUP[fmt]
    return bm * bk // 2, bn * bk // 2, bm * bk // g, bn * bk // g


def path(params: Mapping[str, Any], arch: Any) -> str:
    """How Triton 3.9 lowers the two-FP4 dot_scaled: "native_mma" (sm120/121, mma.sync
    kind::mxf4nvf4), "tcgen05" (sm100, BM ≥ 64; native block-scaled at BM = 128, emulated at 64),
    "wgmma" (sm90, BM ≥ 64, emulated) or "mma_v2" (sm8x emulated, and BM < 64 on sm90/sm100)."""
    major, _ = cc(arch)
    bm = int(params["block_m"])
    if major == 12:
        return "native_mma"
    if major == 10 and bm >= 64:
        return "tcgen05"
    if major == 9 and bm >= 64:
        return "wgmma"
    return "mma_v2"


def _placed(buffers: list[int], scratch: int) -> int:
    """End of Triton's allocation: buffers largest first; the conversion scratch starts on a
    128-byte boundary (visible when three stages of a 64-byte scale tile end off one)."""
    end, pending = 0, scratch
    for b in sorted(buffers, reverse=True):
        if pending and pending > b:
            end, pending = -(-end // 128) * 128 + pending, 0
        end += b
    if pending:
        end = -(-end // 128) * 128 + pending
    return end


def smem_bytes(params: Mapping[str, Any], fmt: str, arch: Any) -> int:
    """Bytes of dynamic shared memory Triton 3.9 allocates for the W4A4 GEMM config on `arch`."""
    if fmt not in GROUP:
        raise ValueError(f"format must be nvfp4 or mxfp4, got {fmt!r}")
    x, w, sa, sb = tiles(params, fmt)
    bn, bk = int(params["block_n"]), int(params["block_k"])
    ns, warps = int(params["num_stages"]), int(params["num_warps"])
    threads = 32 * warps
    p = path(params, arch)
    tiny = p == "native_mma"
    piped = [t for t in (sa, sb) if t >= 4 * threads or (tiny and 2 * t <= threads)]
    unpiped = [t for t in (sa, sb) if t < 4 * threads and 2 * t > threads]
    pipe = (ns - 1) * (x + w + sum(piped))
    if p == "wgmma":
        # emulated: the weight tile is upcast to a bf16 smem operand (BN·BK·2); no scale scratch
        return pipe + bn * bk * 2
    if p == "tcgen05" and int(params["block_m"]) == 64:
        # M = 64 is under the block-scaled tcgen05 tile: emulated, the weight tile upcast to a bf16
        # smem operand, plus 2·SA and 16 bytes of barriers; with 8 warps an unpipelined weight-scale
        # tile keeps its conversion scratch (fitted: the one such config, MXFP4 64×128×128×8w)
        return pipe + bn * bk * 2 + 2 * sa + 16 + (sb if warps == 8 and sb in unpiped else 0)
    if p == "tcgen05":
        # native block-scaled tcgen05 (+ 8 bytes of mbarrier) when both scale tiles are pipelined;
        # with an unpipelined one the figure is the mma.sync rule's
        return pipe + max(unpiped) if unpiped else pipe + 8
    body = _placed([(ns - 1) * t for t in (x, w, *piped)], max(unpiped, default=0))
    # sm8x: the epilogue converts the bf16 output tile through shared memory in the space the dead
    # pipeline buffers leave (as W4A16's does) where the emulated MMA's accumulator layout and the
    # store layout need it: BN ≤ 64, or BN = 128 with 8 warps. Fitted on the whole default space,
    # not derived: with BN = 128 and 4 warps, or BN = 256, no config shows it above the pipeline.
    wide = bn <= 64 or (bn == 128 and warps == 8)
    epilogue = int(params["block_m"]) * bn * 2 if cc(arch)[0] == 8 and wide else 0
    return max(body, epilogue)


def _pow2_ceil(v: int) -> int:
    return 1 << max(5, (v - 1).bit_length())


def tmem_columns(params: Mapping[str, Any], fmt: str, arch: Any) -> int:
    """Tensor-memory columns of the W4A4 GEMM (sm100 tcgen05 only; 0 elsewhere). Allocations are
    powers of two ≥ 32: BM = 64 holds the accumulator and the bf16 operand (BN + BK/2 columns),
    BM = 128 the accumulator and the block scales (the next power of two above BN)."""
    if path(params, arch) != "tcgen05":
        return 0
    bn, bk = int(params["block_n"]), int(params["block_k"])
    if int(params["block_m"]) == 64:
        return _pow2_ceil(bn + bk // 2)
    return _pow2_ceil(bn + 1)
