"""Static model of `metadata.shared` (and tensor memory) for the W4A16 kernel in kernel.py, and
(`w4a4_smem_bytes`, `w4a4_tmem_columns`, at the end) for the W4A4 dot_scaled GEMM in w4a4_kernels.py.

Checked against Triton 3.9.0 by cross-compiling (compile.py, `tt.divisibility` 16 on pointers, N,
K), and against Triton 3.6.0's compiled `metadata.shared` on the H200 (sm90; 0 differences over the
configs bench/triton_h200.py compiled there, 2026-11-29). One rule serves both versions.

Tiles (bytes), with G = 16 (NVFP4) or 32 (MXFP4) and T = 32·num_warps threads:
    X = BM·BK·2 (bf16 activations)   W = BN·BK/2 (packed e2m1)   S = BN·BK/G (scales)

* mma.sync path — sm80/86/89, sm120/121, and sm90/sm100 when BM < 64 (wgmma / tcgen05 need a
  64-row tile): the cp.async pipeliner keeps (num_stages − 1) buffers of every pipelined load.
  The packed weight is local_loaded straight into the dot-operand layout (no dequant buffer).
  The scale load is pipelined only when each thread copies ≥ 4 bytes (S ≥ 4·T); otherwise it is
  a plain load whose layout conversion needs S bytes of scratch (none when S ≤ T/2):
      shared = max((ns − 1)·(X + W + [S if S ≥ 4T]) + [S if T/2 < S < 4T], [E on sm8x])
  E is the epilogue's conversion of the bf16 output tile on sm80/86/89, which reuses the dead
  pipeline buffers (sm90 and sm120 convert without shared memory): the whole tile BM·BN·2 for the
  (BM, BN, warps) in SM8X_FULL_TILE_EPILOGUE, and elsewhere no more than the pipeline already
  holds (see sm8x_epilogue_bytes). For NVFP4 with BM = 16 an unpipelined scale tile of S ≤ T
  bytes needs no scratch (seen on Triton 3.6.0 and 3.9.0).
* wgmma path — sm90, BM ≥ 64: x has num_stages buffers (operand A straight from smem), the packed
  weight (ns − 1), the scales (ns − 1) when pipelined (S ≥ 4T; otherwise their conversion scratch
  fits in the slot of the next buffer), and the dequantized bf16 tile (4·W) is one smem buffer for
  operand B:
      shared = ns·X + (ns − 1)·(W + [S if S ≥ 4T]) + 4·W
* tcgen05 path — sm100/103, BM ≥ 64: as wgmma plus 16 bytes of mbarriers, and here an unpipelined
  MXFP4 scale tile with T < S < 4T keeps its S bytes of conversion scratch (NVFP4's does not;
  fitted on a 20-point sweep of that case):
      shared = ns·X + (ns − 1)·(W + [S if S ≥ 4T]) + 4·W + 16 + [S if MXFP4 and T < S < 4T]
      tensor memory = BN columns (fp32 accumulator; ≤ 256 here, so never over 512)
"""
from __future__ import annotations

from typing import Any, Mapping

CHECKED_VERSIONS = ("3.6", "3.9")
MODEL_NOTE = ("smem model checked against Triton 3.9.0 (cross-compiled, every target) and 3.6.0 (sm90, "
              "compiled on the H200); other versions get the same rule")
GROUP = {"nvfp4": 16, "mxfp4": 32}


def _installed_triton() -> str | None:
    try:
        from importlib.metadata import version
        v = version("triton")
    except Exception:
        return None
    return ".".join(v.split(".")[:2])


def _cc(arch: Any) -> tuple[int, int]:
    if hasattr(arch, "cc"):
        return tuple(arch.cc)
    if isinstance(arch, int):
        return divmod(arch, 10)
    from autotune.core.arch import get_arch
    return get_arch(str(arch)).cc


def path(params: Mapping[str, Any], arch: Any) -> str:
    """Which MMA lowering Triton 3.9 picks: "mma_v2", "wgmma" or "tcgen05"."""
    major, _ = _cc(arch)
    if major == 9 and int(params["block_m"]) >= 64:
        return "wgmma"
    if major == 10 and int(params["block_m"]) >= 64:
        return "tcgen05"
    return "mma_v2"


def tiles(params: Mapping[str, Any], w_fmt: str) -> tuple[int, int, int]:
    bm, bn, bk = int(params["block_m"]), int(params["block_n"]), int(params["block_k"])
    return bm * bk * 2, bn * bk // 2, bn * bk // GROUP[w_fmt]


def smem_bytes(params: Mapping[str, Any], w_fmt: str, arch: Any, triton_version: str | None = None) -> int:
    """Bytes of dynamic shared memory Triton allocates for this config on `arch` (an Arch, a name
    like "sm90" or a cc int like 90). `triton_version` "major.minor" (default: the installed one,
    read from package metadata without importing Triton)."""
    if w_fmt not in GROUP:
        raise ValueError(f"weight format must be nvfp4 or mxfp4, got {w_fmt!r}")
    _ = triton_version or _installed_triton()   # one rule for every version (MODEL_NOTE)
    x, w, s = tiles(params, w_fmt)
    ns = int(params["num_stages"])
    threads = 32 * int(params["num_warps"])
    p = path(params, arch)
    s_pipe = s if s >= 4 * threads else 0
    if p == "wgmma":
        return ns * x + (ns - 1) * (w + s_pipe) + 4 * w
    if p == "tcgen05":
        # MXFP4 only: NVFP4's unpipelined scales convert without scratch here (sm100 sweep, 3.9.0)
        scratch = s if (w_fmt == "mxfp4" and not s_pipe and s > threads) else 0
        return ns * x + (ns - 1) * (w + s_pipe) + 4 * w + 16 + scratch
    # mma.sync: pipeline buffers, or on sm8x the epilogue's conversion scratch (after the loop, in
    # the space the dead buffers leave; sm90+ convert without it), whichever is larger
    epilogue = sm8x_epilogue_bytes(params) if _cc(arch)[0] == 8 else 0
    return max(_mma_pipeline(params, w_fmt), epilogue)


def _mma_pipeline(params: Mapping[str, Any], w_fmt: str) -> int:
    """mma.sync path without the epilogue: the pipeline buffers plus the scale tile's conversion
    scratch when it is not pipelined (none for NVFP4 when 16 rows meet ≤ 1 scale byte per thread)."""
    x, w, s = tiles(params, w_fmt)
    ns, threads = int(params["num_stages"]), 32 * int(params["num_warps"])
    if s >= 4 * threads:
        return (ns - 1) * (x + w + s)
    if s <= threads // 2 or (w_fmt == "nvfp4" and int(params["block_m"]) == 16 and s <= threads):
        return (ns - 1) * (x + w)
    return (ns - 1) * (x + w) + s


#: sm8x: the (BM, BN, num_warps) whose epilogue conversion of the bf16 output tile (MMA layout →
#: store layout, through shared memory) needs the whole BM·BN·2-byte tile. Triton sizes that
#: scratch by its swizzled-conversion rule (optimalSwizzling's size / reps), which is the whole
#: tile only here; for every other (BM, BN) in 16…128 × 32…256 at 4 or 8 warps it is at most the
#: smallest pipeline of that tile (BK = 64, 2 stages), so it never sets the total. Measured by
#: cross-compiling Triton 3.9.0 for sm89 (`python3 -m tactics.triton_fp4.smem --fit-epilogue`).
SM8X_FULL_TILE_EPILOGUE = frozenset({(32, 256, 8), (64, 128, 8), (128, 128, 8)})
_EPILOGUE_FITTED = {"block_m": (16, 32, 64, 128), "block_n": (32, 64, 128, 256), "num_warps": (4, 8)}


def sm8x_epilogue_bytes(params: Mapping[str, Any]) -> int:
    """Shared memory the sm8x epilogue needs beyond what the pipeline already reserves: the whole
    bf16 tile where SM8X_FULL_TILE_EPILOGUE says so, 0 elsewhere in the fitted domain (its scratch
    fits in the pipeline's), and the whole tile outside it (never an under-estimate)."""
    bm, bn, warps = int(params["block_m"]), int(params["block_n"]), int(params["num_warps"])
    fitted = all(int(params[k]) in v for k, v in _EPILOGUE_FITTED.items())
    if fitted and (bm, bn, warps) not in SM8X_FULL_TILE_EPILOGUE:
        return 0
    return bm * bn * 2


def fit_epilogue(arch: str = "sm89", jobs: int = 2) -> set[tuple[int, int, int]]:
    """Re-derive SM8X_FULL_TILE_EPILOGUE: cross-compile every (BM, BN, warps) of the fitted domain
    at its smallest pipeline (NVFP4, BK = 64, 2 stages); where the compiler allocates more than
    the pipeline rule, the epilogue set the total — and that excess must be the whole tile, or
    the model's form is wrong (raises)."""
    import itertools

    from joblib import Parallel, delayed

    from .compile import cross_compile
    cfgs = [dict(block_m=bm, block_n=bn, block_k=64, group_m=1, num_warps=w, num_stages=2, split_k=1,
                 kernel="w4a16_dequant")
            for bm, bn, w in itertools.product(*_EPILOGUE_FITTED.values())]
    shared = Parallel(n_jobs=jobs)(delayed(cross_compile)("nvfp4", c, arch) for c in cfgs)
    full = set()
    for c, (got, _) in zip(cfgs, shared):
        pipe = _mma_pipeline(c, "nvfp4")
        if got > pipe:
            if got != c["block_m"] * c["block_n"] * 2:
                raise AssertionError(f"{c}: compiler {got} is neither the pipeline {pipe} nor the whole tile")
            full.add((c["block_m"], c["block_n"], c["num_warps"]))
    return full


def tmem_columns(params: Mapping[str, Any], w_fmt: str, arch: Any) -> int:
    """Tensor-memory columns (sm100 tcgen05 accumulator: BN fp32 columns; 0 elsewhere)."""
    return int(params["block_n"]) if path(params, arch) == "tcgen05" else 0


# ---- W4A4: tl.dot_scaled with two packed e2m1 operands (w4a4_kernels.w4a4_gemm_kernel) -------------
#
# Fitted on Triton 3.9.0 by cross-compiling the member's whole default space (126 configs × 2
# formats) for sm89, sm90, sm100, sm120 and sm121 (issue #4, 2026-11-29; docs/triton-fp4.md, W4A4).
# Tiles (bytes), G = 16 (NVFP4) or 32 (MXFP4), T = 32·num_warps threads:
#     X = BM·BK/2, W = BN·BK/2 (packed e2m1), SA = BM·BK/G, SB = BN·BK/G (scales)
# A scale tile is cp.async-pipelined when each thread copies ≥ 4 bytes (S ≥ 4T); on sm12x also when
# it is at most half a byte per thread (S ≤ T/2: a few threads copy whole 4-byte rows), which
# elsewhere costs no shared memory at all; in between it is a plain load whose layout conversion
# needs S bytes of scratch (the larger tile's when both are).

def _w4a4_tiles(params: Mapping[str, Any], fmt: str) -> tuple[int, int, int, int]:
    bm, bn, bk = int(params["block_m"]), int(params["block_n"]), int(params["block_k"])
    g = GROUP[fmt]
    return bm * bk // 2, bn * bk // 2, bm * bk // g, bn * bk // g


def w4a4_path(params: Mapping[str, Any], arch: Any) -> str:
    """How Triton 3.9 lowers the two-FP4 dot_scaled: "native_mma" (sm120/121, mma.sync
    kind::mxf4nvf4), "tcgen05" (sm100, BM ≥ 64; native block-scaled at BM = 128, emulated at 64),
    "wgmma" (sm90, BM ≥ 64, emulated) or "mma_v2" (sm8x emulated, and BM < 64 on sm90/sm100)."""
    major, _ = _cc(arch)
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


def w4a4_smem_bytes(params: Mapping[str, Any], fmt: str, arch: Any) -> int:
    """Bytes of dynamic shared memory Triton 3.9 allocates for the W4A4 GEMM config on `arch`."""
    if fmt not in GROUP:
        raise ValueError(f"format must be nvfp4 or mxfp4, got {fmt!r}")
    x, w, sa, sb = _w4a4_tiles(params, fmt)
    bn, bk = int(params["block_n"]), int(params["block_k"])
    ns, warps = int(params["num_stages"]), int(params["num_warps"])
    threads = 32 * warps
    p = w4a4_path(params, arch)
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
    epilogue = int(params["block_m"]) * bn * 2 if _cc(arch)[0] == 8 and wide else 0
    return max(body, epilogue)


def _pow2_ceil(v: int) -> int:
    return 1 << max(5, (v - 1).bit_length())


def w4a4_tmem_columns(params: Mapping[str, Any], fmt: str, arch: Any) -> int:
    """Tensor-memory columns of the W4A4 GEMM (sm100 tcgen05 only; 0 elsewhere). Allocations are
    powers of two ≥ 32: BM = 64 holds the accumulator and the bf16 operand (BN + BK/2 columns),
    BM = 128 the accumulator and the block scales (the next power of two above BN)."""
    if w4a4_path(params, arch) != "tcgen05":
        return 0
    bn, bk = int(params["block_n"]), int(params["block_k"])
    if int(params["block_m"]) == 64:
        return _pow2_ceil(bn + bk // 2)
    return _pow2_ceil(bn + 1)


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] != ["--fit-epilogue"]:
        sys.exit("usage: python3 -m tactics.triton_fp4.smem --fit-epilogue [ARCH]")
    found = fit_epilogue(sys.argv[2] if len(sys.argv) > 2 else "sm89")
    print("full-tile epilogues:", sorted(found), "(model:", sorted(SM8X_FULL_TILE_EPILOGUE), ")")
    sys.exit(0 if found == SM8X_FULL_TILE_EPILOGUE else 1)
