"""Static model of `metadata.shared` (and tensor memory) for the W4A16 kernels in kernel.py (the fused
dense kernel and the grouped-MoE kernel, which share the main loop); smem_w4a4.py models the W4A4 GEMM.

Checked against Triton 3.9.0 by cross-compiling (compile.py, `tt.divisibility` 16 on pointers, N,
K), and against Triton 3.6.0's compiled `metadata.shared` on the H200 (sm90; 0 differences over the
configs bench/triton_h200.py compiled there, 2026-11-29). One rule serves both versions.

Tiles (bytes), with G = 16 (NVFP4) or 32 (MXFP4) and T = 32·num_warps threads:
    X = BM·BK·2 (bf16 activations)   W = BN·BK/2 (packed e2m1)   S = BN·BK/G (scales)

* mma.sync path — sm80/86/89, sm120/121, and sm90/sm100 when BM < 64 (wgmma / tcgen05 need a
  64-row tile) or with fewer than 4 warps (and 16 warps on sm100): the cp.async pipeliner keeps
  (num_stages − 1) buffers of every pipelined load; a packed-weight tile under 4 bytes per thread
  (W < 4T) is instead one plain load with W bytes of conversion scratch.
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
      tensor memory = max(32, BN) columns (fp32 accumulator), twice that at BM = 256

`unchecked` names the configs outside the region this was checked on (REGION); the family's
verdict gives them the compiler's figure or `unknown`, never the rule's.
"""
from __future__ import annotations

from typing import Any, Mapping

from autotune.core.arch import get_arch

from .member import GROUP

CHECKED_VERSIONS = ("3.6", "3.9")
MODEL_NOTE = ("smem model checked against Triton 3.9.0 (cross-compiled, every target) and 3.6.0 (sm90, "
              "compiled on the H200); other versions get the same rule")


def _installed_triton() -> str | None:
    try:
        from importlib.metadata import version
        v = version("triton")
    except Exception:
        return None
    return ".".join(v.split(".")[:2])


def cc(arch: Any) -> tuple[int, int]:
    if hasattr(arch, "cc"):
        return tuple(arch.cc)
    if isinstance(arch, int):
        return divmod(arch, 10)
    return get_arch(str(arch)).cc


def path(params: Mapping[str, Any], arch: Any) -> str:
    """Which MMA lowering Triton 3.9 picks: "mma_v2", "wgmma" or "tcgen05". wgmma and tcgen05 need
    a 64-row tile and whole warp groups; below 4 warps, and at 16 warps on sm100, Triton falls
    back to mma.sync (cross-compiled, Triton 3.9.0)."""
    major, _ = cc(arch)
    bm, warps = int(params["block_m"]), int(params["num_warps"])
    if major == 9 and bm >= 64 and warps >= 4:
        return "wgmma"
    if major == 10 and bm >= 64 and warps in (4, 8):
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
    epilogue = sm8x_epilogue_bytes(params) if cc(arch)[0] == 8 else 0
    return max(mma_pipeline(params, w_fmt), epilogue)


def mma_pipeline(params: Mapping[str, Any], w_fmt: str) -> int:
    """mma.sync path without the epilogue: the pipeline buffers plus the conversion scratch of the
    tiles that are not pipelined. A tile is cp.async-pipelined when each thread copies ≥ 4 bytes
    (≥ 4T). The packed weight otherwise is one plain load with W bytes of scratch (seen at 16
    warps, BN 32, BK 64); the scales need S bytes of scratch, none when S ≤ T/2 or, for NVFP4
    with BM = 16, when S ≤ T."""
    x, w, s = tiles(params, w_fmt)
    ns, threads = int(params["num_stages"]), 32 * int(params["num_warps"])
    w_pipe, w_scratch = (w, 0) if w >= 4 * threads else (0, w)
    if s >= 4 * threads:
        return (ns - 1) * (x + w_pipe + s) + w_scratch
    if s <= threads // 2 or (w_fmt == "nvfp4" and int(params["block_m"]) == 16 and s <= threads):
        return (ns - 1) * (x + w_pipe) + w_scratch
    return (ns - 1) * (x + w_pipe) + s + w_scratch      # both unpipelined: `unchecked` says so


#: sm8x: the (BM, BN, num_warps) whose epilogue conversion of the bf16 output tile (MMA layout →
#: store layout, through shared memory) needs the whole BM·BN·2-byte tile. Triton sizes that
#: scratch by its swizzled-conversion rule (optimalSwizzling's size / reps), which is the whole
#: tile only here; for every other (BM, BN) in 16…128 × 32…256 at 1…16 warps it is at most the
#: smallest pipeline of that tile (BK = 64, 2 stages), so it never sets the total. Measured by
#: cross-compiling Triton 3.9.0 for sm89 (`python3 -m tools.triton_smem.fit_epilogue`).
SM8X_FULL_TILE_EPILOGUE = frozenset({(32, 256, 8), (64, 128, 8), (128, 128, 8),
                                     (32, 256, 16), (64, 128, 16), (64, 256, 16), (128, 128, 16), (128, 256, 16)})
EPILOGUE_FITTED = {"block_m": (16, 32, 64, 128), "block_n": (32, 64, 128, 256), "num_warps": (1, 2, 4, 8, 16)}


def sm8x_epilogue_bytes(params: Mapping[str, Any]) -> int:
    """Shared memory the sm8x epilogue needs beyond what the pipeline already reserves: the whole
    bf16 tile where SM8X_FULL_TILE_EPILOGUE says so, 0 elsewhere in the fitted domain (its scratch
    fits in the pipeline's), and the whole tile outside it (never an under-estimate)."""
    bm, bn, warps = int(params["block_m"]), int(params["block_n"]), int(params["num_warps"])
    fitted = all(int(params[k]) in v for k, v in EPILOGUE_FITTED.items())
    if fitted and (bm, bn, warps) not in SM8X_FULL_TILE_EPILOGUE:
        return 0
    return bm * bn * 2


def tmem_columns(params: Mapping[str, Any], w_fmt: str, arch: Any) -> int:
    """Tensor-memory columns of the tcgen05 fp32 accumulator (0 on the other paths): BN columns,
    at least 32 (the allocation granule), twice that for BM = 256 (two 128-row halves)."""
    if path(params, arch) != "tcgen05":
        return 0
    cols = max(32, int(params["block_n"]))
    return 2 * cols if int(params["block_m"]) == 256 else cols


#: where the model was checked against Triton 3.9.0 cross-compiles (the default space exhaustively,
#: docs/triton-smem-table.md; beyond it the samples of tests/test_triton_crosscompile.py and
#: the adversarial sweep); a config outside needs the compiler's figure or its verdict is unknown
REGION = {"block_m": (16, 32, 64, 128, 256), "block_n": (32, 64, 128, 256), "block_k": (64, 128, 256, 512),
          "num_warps": (1, 2, 4, 8, 16), "num_stages": (2, 3, 4, 5, 6, 7, 8)}
#: arch majors the model was checked on (sm80/86/89, sm90, sm100/103, sm120/121)
REGION_MAJORS = (8, 9, 10, 12)


def unchecked(params: Mapping[str, Any], w_fmt: str, arch: Any) -> str | None:
    """Why the model was not checked against the compiler for this config, or None."""
    major = cc(arch)[0]
    if major not in REGION_MAJORS:
        return f"smem model not checked on sm{major}x"
    for k, vals in REGION.items():
        if int(params[k]) not in vals:
            return f"{k}={params[k]} is outside the smem model's checked region ({k} in {vals})"
    if major == 8 and not all(int(params[k]) in v for k, v in EPILOGUE_FITTED.items()):
        return ("the sm8x epilogue scratch is fitted for BLOCK_M 16..128 and BLOCK_N 32..256 "
                f"only (BLOCK_M={params['block_m']}, BLOCK_N={params['block_n']}, {params['num_warps']} warps)")
    if int(params["block_m"]) == 256 and major not in (9, 10):
        return f"BLOCK_M=256 is checked on sm90 and sm100 only, not sm{major}x"
    _, w, s = tiles(params, w_fmt)
    threads = 32 * int(params["num_warps"])
    if w < 4 * threads and path(params, arch) != "mma_v2":
        return f"an unpipelined weight tile ({w} B at {params['num_warps']} warps) on {path(params, arch)} is not modelled"
    if w < 4 * threads and threads // 2 < s < 4 * threads:
        return f"unpipelined weight ({w} B) and scale ({s} B) tiles together are not modelled"
    return None
