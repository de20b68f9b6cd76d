"""The `triton` tactic family for bf16 × FP4 (NVFP4/MXFP4) GEMMs, three kernels:

* `w4a16_dequant` — the fused kernel of kernel.py (dequantize in registers, tl.dot), with BLOCK_M/N/K,
  GROUP_M, SPLIT_K (decode: small row tiles, K split over many programs), num_warps, num_stages;
* `dequant_cublas` — a Triton kernel dequantizes the weight to bf16, then cuBLAS multiplies (wins
  at large M, where the fused kernel's per-tile dequantization costs more than a bf16 copy);
* `moe_w4a16` — grouped MoE (grouped_moe problems): the fused main loop over stacked experts, rows
  sorted by expert and padded to BLOCK_M per expert (MoELauncher aligns the routing on the device);
* `w4a4_dot_scaled` — W4A4 problems only (a_fmt == w_fmt, FP4): our activation quantizer, then
  tl.dot_scaled with two FP4 operands (w4a4.py; its space, verdicts and launcher live there).

verdict() is pure: it imports nothing from Triton and never compiles. It rejects by rule (K tiling,
split-K steps), by the compile-compatibility table in compat.py (Triton version × arch × format),
and by the static shared-memory model in smem.py (equal to Triton 3.9.0's `metadata.shared` on the
cross-compiled samples and to Triton 3.6.0's on every kept config at GLM-5 TP8 shapes on an H200).
`precompile()` compiles a config ahead of timing into Triton's cache (the search runs it in many
processes); the launch then finds it there.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable

from autotune.core.tactic import Tactic, Verdict
from tactics.base import FamilyBase

from . import compat as _compat
from . import smem as _smem
from .args import U8_LAYOUT, fp32_scale, note_compiled, pack_u8, scales_u8
from . import w4a4 as _w4a4

NAME = "triton"
KERNEL = "w4a16_dequant"
#: Triton dequantizes the whole weight to bf16 (once per call), then cuBLAS multiplies
DQ_KERNEL = "dequant_cublas"
#: grouped MoE: tokens sorted by expert, per-block expert ids, stacked weights [E, N, K/2]
MOE_KERNEL = "moe_w4a16"
KERNELS = (KERNEL, DQ_KERNEL, MOE_KERNEL)
MOE_PARAMS = ("block_k", "block_m", "block_n", "kernel", "num_stages", "num_warps")
MOE_BLOCK_M = (16, 32, 64)
MOE_BLOCK_N = (32, 64, 128)
MOE_BLOCK_K = (128, 256)
MOE_STAGES = (3, 4)
PARAMS = ("block_k", "block_m", "block_n", "group_m", "kernel", "num_stages", "num_warps", "split_k")
DQ_PARAMS = ("block_k", "block_n", "kernel", "num_warps")
DQ_TILE = {"block_n": 32, "block_k": 256, "num_warps": 4}

BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (64, 128, 256)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)
GROUP_M = (1, 8)
#: split-K sub-space (decode): small row tiles, many K splits, so a few rows still fill the GPU
SPLIT_K = (2, 4, 8, 16)
SPLIT_BLOCK_M = (16, 32)
SPLIT_BLOCK_N = (32, 64, 128)
SPLIT_BLOCK_K = (128, 256)
SPLIT_STAGES = (3, 4)
#: a split-K workspace larger than this is refused at call time (M too large for that tactic)
MAX_WORKSPACE_BYTES = 256 << 20

_POW2_MN = (16, 32, 64, 128, 256)
_POW2_K = (64, 128, 256, 512)
_WARPS_OK = (1, 2, 4, 8, 16)
_SPLITS_OK = (1, 2, 4, 8, 16, 32)
#: MXFP4 scale rows narrower than 4 bytes (BLOCK_K < 128) are not cp.async-pipelined in Triton
#: 3.9: their layout conversion needs scratch that smem.py does not model, so they are rejected.
MIN_BLOCK_K = {"nvfp4": 64, "mxfp4": 128}

_NO_CPU = "no CUDA GPU: Triton kernels need one (TRITON_INTERPRET=1 runs them only for tests)"


def _silly(bm: int, bn: int, bk: int, warps: int, stages: int) -> bool:
    """Combinations pruned by rule (never by compiling)."""
    if warps == 8 and bm * bn < 64 * 128:        # 8 warps on a small tile: idle warps
        return True
    if warps == 4 and bm * bn >= 128 * 256:      # 128x256 fp32 accumulator on 128 threads: spills
        return True
    if bn * bk > 256 * 128:                      # dequantized tile of > 32K elements in registers
        return True
    return False


def _supported(problem: Any) -> str | None:
    if getattr(problem, "kind", None) not in ("dense", "grouped_moe"):
        return f"triton w4a16 kernels handle dense and grouped_moe problems, not {getattr(problem, 'kind', None)!r}"
    if problem.a_fmt != "bf16":
        return f"triton w4a16 kernel needs bf16 activations, not {problem.a_fmt}"
    if problem.w_fmt not in ("nvfp4", "mxfp4"):
        return f"triton w4a16 kernel needs nvfp4/mxfp4 weights, not {problem.w_fmt}"
    if problem.out_dtype != "bf16":
        return f"triton w4a16 kernel writes bf16, not {problem.out_dtype}"
    return None


class TritonFamily(FamilyBase):
    name = NAME
    depends_on = ("triton",)
    default_rank = 0      # the designated default wherever a GPU runs Triton
    compiles = True

    def supports(self, problem: Any) -> str | None:
        return _w4a4.supported(problem) if _w4a4.is_w4a4(problem) else _supported(problem)

    def layout(self, tactic: Tactic) -> str:
        return U8_LAYOUT

    def pack(self, layout: str, weight: Any) -> Any:
        if layout != U8_LAYOUT:
            return super().pack(layout, weight)
        return pack_u8(weight)

    # ---- availability -------------------------------------------------------------------------
    def available(self, device: str) -> tuple[bool, str]:
        if str(device).startswith("cpu"):
            return False, _NO_CPU
        try:
            import triton  # noqa: F401
        except Exception:
            return False, "triton is not installed"
        return True, ""

    # ---- space --------------------------------------------------------------------------------
    def enumerate(self, problem: Any, arch: Any) -> list[Tactic]:
        if _w4a4.is_w4a4(problem):
            return _w4a4.enumerate_space(problem, arch)     # W4A4 problems: only the dot_scaled member
        if _supported(problem) is not None:
            return []
        out = []
        mink = MIN_BLOCK_K[problem.w_fmt]
        if problem.kind == "grouped_moe":
            return [Tactic(NAME, kernel=MOE_KERNEL, block_m=bm, block_n=bn, block_k=bk, num_warps=4, num_stages=st)
                    for bm, bn, bk, st in itertools.product(MOE_BLOCK_M, MOE_BLOCK_N, MOE_BLOCK_K, MOE_STAGES)
                    if bk >= mink]
        for bm, bn, bk, warps, stages, gm in itertools.product(BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS,
                                                               NUM_STAGES, GROUP_M):
            if bk < mink or _silly(bm, bn, bk, warps, stages):
                continue
            out.append(self._tactic(bm, bn, bk, gm, warps, stages))
        for bm, bn, bk, stages, sk in itertools.product(SPLIT_BLOCK_M, SPLIT_BLOCK_N, SPLIT_BLOCK_K,
                                                        SPLIT_STAGES, SPLIT_K):
            if bk >= mink and not _silly(bm, bn, bk, 4, stages):
                out.append(self._tactic(bm, bn, bk, 1, 4, stages, sk))
        out.append(Tactic(NAME, kernel=DQ_KERNEL, **DQ_TILE))
        return out

    @staticmethod
    def _tactic(bm: int, bn: int, bk: int, gm: int, warps: int, stages: int, split_k: int = 1) -> Tactic:
        return Tactic(NAME, kernel=KERNEL, block_m=bm, block_n=bn, block_k=bk, group_m=gm,
                      num_warps=warps, num_stages=stages, split_k=split_k)

    def validate(self, tactic: Tactic) -> str | None:
        if tactic.family != NAME:
            return f"family is {tactic.family!r}, not {NAME!r}"
        p = tactic.params
        kernel = p.get("kernel")
        if kernel == _w4a4.KERNEL:
            return _w4a4.validate(p)
        if kernel not in KERNELS:
            return f"unknown triton kernel {kernel!r} (known: {', '.join(KERNELS)})"
        want = {KERNEL: PARAMS, DQ_KERNEL: DQ_PARAMS, MOE_KERNEL: MOE_PARAMS}[kernel]
        if tuple(sorted(p)) != want:
            return f"triton {kernel} tactic needs exactly the parameters {want}, got {tuple(sorted(p))}"
        for k in want:
            v = p[k]
            if k != "kernel" and (not isinstance(v, int) or isinstance(v, bool)):
                return f"{k} must be an int, got {v!r}"
        if kernel == DQ_KERNEL:
            if p["block_n"] not in _POW2_MN or p["block_k"] not in _POW2_K or p["num_warps"] not in _WARPS_OK:
                return f"dequant tile must use block_n in {_POW2_MN}, block_k in {_POW2_K}, num_warps in {_WARPS_OK}"
            return None
        if p["block_m"] not in _POW2_MN or p["block_n"] not in _POW2_MN:
            return f"block_m/block_n must be one of {_POW2_MN}"
        if p["block_k"] not in _POW2_K:
            return f"block_k must be one of {_POW2_K}"
        if p["num_warps"] not in _WARPS_OK:
            return f"num_warps must be one of {_WARPS_OK}"
        if not 1 <= p["num_stages"] <= 8:
            return "num_stages must be in 1..8"
        if kernel == KERNEL and p["split_k"] not in _SPLITS_OK:
            return f"split_k must be one of {_SPLITS_OK}"
        if kernel == KERNEL and not 1 <= p["group_m"] <= 64:
            return "group_m must be in 1..64"
        return None

    # ---- static judgement ---------------------------------------------------------------------
    def verdict(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        if tactic.family == NAME and tactic.get("kernel") == _w4a4.KERNEL:
            return _w4a4.verdict(problem, tactic, arch)
        why = self.validate(tactic) or _supported(problem)
        if why:
            return Verdict.reject(why)
        p = tactic.params
        bk = p["block_k"]
        stages = p.get("num_stages")
        if (p["kernel"] == MOE_KERNEL) != (problem.kind == "grouped_moe"):
            return Verdict.reject(f"triton kernel {p['kernel']} does not run {problem.kind} problems")
        if bk < MIN_BLOCK_K[problem.w_fmt]:
            return Verdict.reject(
                f"BLOCK_K={bk} < {MIN_BLOCK_K[problem.w_fmt]} for {problem.w_fmt}: scale rows under 4 bytes "
                "are not cp.async-pipelined (layout-conversion scratch not covered by the smem model)",
                stages=stages)
        if problem.k % bk:
            return Verdict.reject(f"BLOCK_K={bk} does not divide K={problem.k} (the kernel does not mask K)",
                                  stages=stages)
        if problem.n % 16:
            return Verdict.reject(f"N={problem.n} is not a multiple of 16 (the kernel is specialized for it)",
                                  stages=stages)
        if p["kernel"] in (KERNEL, MOE_KERNEL):
            if stages < 2:
                return Verdict.reject("num_stages must be >= 2 (the smem model covers pipelined loops only)",
                                      stages=stages)
            steps = problem.k // bk
            if p.get("split_k", 1) > 1 and steps < 2 * p["split_k"]:
                return Verdict.reject(f"split_k={p['split_k']} leaves < 2 of the K/BLOCK_K={steps} steps per split",
                                      stages=stages)
        if not getattr(arch, "is_gpu", True):
            return Verdict.keep(stages=stages)          # cpu pseudo-arch: interpreter, no smem limit
        if arch.cc[0] < 8:
            return Verdict.reject(f"{arch.name}: the kernel needs sm80 or newer (bf16 tl.dot, fma.rn.bf16x2)",
                                  stages=stages)
        why = _compat.rejection(p["kernel"], problem.w_fmt, arch)
        if why:
            return Verdict.reject(why, stages=stages)
        if p["kernel"] == DQ_KERNEL:
            return Verdict.keep(stages=stages)          # no pipelined loop: no smem to model
        need = _smem.smem_bytes(p, problem.w_fmt, arch)
        limit = arch.smem_per_block_optin
        if need > limit:
            return Verdict.reject(f"smem {need} > {limit}", smem=need, limit=limit, stages=stages)
        if arch.cc[0] == 10:
            cols = _smem.tmem_columns(p, problem.w_fmt, arch)
            if cols > 512:
                return Verdict.reject(f"tmem {cols} columns > 512", smem=need, limit=limit, stages=stages)
        return Verdict.keep(need, limit, stages)

    def default(self, problem: Any, arch: Any) -> Tactic:
        if _w4a4.is_w4a4(problem):
            return _w4a4.default(problem, arch)
        k = getattr(problem, "k", 128)
        bk = next((b for b in (128, 64, 256) if k % b == 0 and b >= MIN_BLOCK_K.get(problem.w_fmt, 64)), 128)
        if getattr(problem, "kind", "dense") == "grouped_moe":
            return Tactic(NAME, kernel=MOE_KERNEL, block_m=32, block_n=64, block_k=max(bk, 128), num_warps=4,
                          num_stages=3)
        return self._tactic(64, 64, bk, 8, 4, 3)

    # ---- build --------------------------------------------------------------------------------
    def build(self, problem: Any, tactic: Tactic, device: str) -> Callable[..., Any]:
        if tactic.get("kernel") == _w4a4.KERNEL:
            why = self.validate(tactic) or _w4a4.supported(problem)
            if not why and problem.k % tactic["block_k"]:
                why = f"block_k {tactic['block_k']} does not divide K={problem.k}"
            if why:
                raise ValueError(why)
            return _w4a4.W4A4Launcher(problem, tactic.params)
        why = self.validate(tactic) or _supported(problem)
        if not why and problem.k % tactic["block_k"]:
            # the kernel does not mask K: such a config would read past each weight row
            why = f"block_k {tactic['block_k']} does not divide K={problem.k}"
        if why:
            raise ValueError(why)
        if (tactic["kernel"] == MOE_KERNEL) != (problem.kind == "grouped_moe"):
            raise ValueError(f"triton kernel {tactic['kernel']} does not run {problem.kind} problems")
        if tactic["kernel"] == DQ_KERNEL:
            return DequantCublasLauncher(problem, tactic.params)
        if tactic["kernel"] == MOE_KERNEL:
            return MoELauncher(problem, tactic.params)
        return W4A16Launcher(problem, tactic.params)

    def precompile(self, problem: Any, tactic: Tactic, arch: Any) -> int | None:
        """Compile the kernel for `arch` into Triton's on-disk cache (the launch's JIT then finds
        it) and return the compiled `metadata.shared` (None for the dequant-then-cuBLAS kernel)."""
        if tactic.get("kernel") == _w4a4.KERNEL:
            why = self.validate(tactic) or _w4a4.supported(problem)
            if why:
                raise ValueError(why)
            _w4a4.cross_compile(problem.w_fmt, None, arch, stop_at="cubin")     # the activation quantizer
            return int(_w4a4.cross_compile(problem.w_fmt, tactic.params, arch, stop_at="cubin").metadata.shared)
        why = self.validate(tactic) or _supported(problem)
        if why:
            raise ValueError(why)
        from .compile import cross_compile
        if tactic["kernel"] == DQ_KERNEL:
            return None
        shared, _ = cross_compile(problem.w_fmt, tactic.params, arch, stop_at="cubin")
        return shared


def _weight_args(prob: Any, x, w):
    import torch
    fmt = getattr(w, "fmt", prob.w_fmt)
    if fmt != prob.w_fmt:
        raise ValueError(f"weight format {fmt} does not match the problem's {prob.w_fmt}")
    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"x must be a 2-D bf16 tensor, got {tuple(x.shape)} {x.dtype}")
    m, k = x.shape
    n = w.packed.shape[0]
    if k != prob.k or n != prob.n or tuple(w.packed.shape) != (n, k // 2):
        raise ValueError(f"shapes x{tuple(x.shape)} packed{tuple(w.packed.shape)} do not fit "
                         f"N={prob.n} K={prob.k}")
    return m, n, k, w.packed.contiguous(), scales_u8(w), fp32_scale(w.global_scale, x.device)


def _out(out, m: int, n: int, x):
    import torch
    if out is None:
        return torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if out.shape != (m, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 tensor of shape {(m, n)}")
    return out


class W4A16Launcher:
    """kernel(x, w, out=None) -> y. `w` has .packed, .scales, .global_scale, .fmt (FP4Weight).

    After the first call, `smem_compiled` holds the compiled kernel's `metadata.shared` (None
    under TRITON_INTERPRET=1, where nothing is compiled) and `smem_model` the static model's value
    for the device's arch. With split_k > 1 the launcher owns an fp32 workspace and a zeroed
    int32 counter per output tile (the kernel leaves them zero): one launch at a time per launcher.
    The split is lowered for large M so the workspace stays under MAX_WORKSPACE_BYTES.
    """

    def __init__(self, problem: Any, params: dict[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.smem_compiled: int | None = None
        self.smem_model: int | None = None
        self.compiled = None
        self._ws = None
        self._locks = None
        self._retired: list = []   # outgrown workspaces: a CUDA graph captured earlier still points at them
        from .compile import constexprs_for
        interp = is_interpreting()
        # resolved once per launcher, not per call: dispatch calls this on every GEMM
        self._consts = {**constexprs_for(problem.w_fmt, self.params), "DOT_F32": 1 if interp else 0,
                        "DEQ_ASM": 0 if interp else 1}

    def _split(self, tiles: int) -> int:
        """split_k is an upper bound: halved until the workspace fits MAX_WORKSPACE_BYTES (large M
        needs no split; the same tactic stays usable at every M)."""
        sk, tile = self.params["split_k"], self.params["block_m"] * self.params["block_n"] * 4
        while sk > 1 and sk * tiles * tile > MAX_WORKSPACE_BYTES:
            sk //= 2
        return sk

    def _scratch(self, sk: int, tiles: int, device):
        """Workspace [sk, tiles, BM·BN] fp32 and `tiles` zeroed counters (grown on demand)."""
        import torch
        need = sk * tiles * self.params["block_m"] * self.params["block_n"] if sk > 1 else 4
        if self._ws is None or self._ws.numel() < need or self._locks.numel() < tiles or self._ws.device != device:
            if self._ws is not None:
                self._retired.append((self._ws, self._locks))
            self._locks = torch.zeros(max(4, tiles), dtype=torch.int32, device=device)
            self._ws = torch.empty(need, dtype=torch.float32, device=device)
        return self._ws, self._locks

    def __call__(self, x, w, out=None):
        import triton

        from .kernel import w4a16_dequant_kernel

        prob, p = self.problem, self.params
        m, n, k, packed, scales, gs = _weight_args(prob, x, w)
        x = x.contiguous()
        out = _out(out, m, n, x)
        if m == 0:
            return out
        bm, bn = p["block_m"], p["block_n"]
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        sk = self._split(tiles)
        ws, locks = self._scratch(sk, tiles, x.device)
        ck = w4a16_dequant_kernel[(tiles, sk)](x, packed, scales, gs, out, ws, locks, m, n, k,
                                               num_warps=p["num_warps"], num_stages=p["num_stages"],
                                               **{**self._consts, "SPLIT_K": sk})
        note_compiled(self, ck, x.device, lambda arch: _smem.smem_bytes(p, prob.w_fmt, arch))
        return out


class DequantCublasLauncher:
    """kernel(x, w, out=None) -> y: a Triton kernel dequantizes W to a bf16 [N, K] buffer the
    launcher owns (global scale folded in), then torch.matmul (cuBLAS) multiplies. Pays N·K·2
    bytes written and read per call, so it only wins where the GEMM itself dominates (large M)."""

    smem_compiled = None        # no pipelined loop, nothing for the smem model to answer for
    smem_model = None

    def __init__(self, problem: Any, params: dict[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self._wbuf = None
        interp = is_interpreting()
        fmt = problem.w_fmt
        self._consts = {"BLOCK_N": params["block_n"], "BLOCK_K": params["block_k"],
                        "SCALE_GROUP": 16 if fmt == "nvfp4" else 32, "SCALE_E4M3": 1 if fmt == "nvfp4" else 0,
                        "DEQ_ASM": 0 if interp else 1}

    def __call__(self, x, w, out=None):
        import torch
        import triton

        from .kernel import dequant_bf16_kernel

        prob, p = self.problem, self.params
        m, n, k, packed, scales, gs = _weight_args(prob, x, w)
        out = _out(out, m, n, x)
        if m == 0:
            return out
        if self._wbuf is None or self._wbuf.device != x.device:
            self._wbuf = torch.empty((n, k), dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(n, p["block_n"]), k // p["block_k"])
        dequant_bf16_kernel[grid](packed, scales, gs, self._wbuf, n, k, num_warps=p["num_warps"], **self._consts)
        torch.matmul(x, self._wbuf.T, out=out)
        return out


class MoELauncher:
    """kernel(x, w, topk_ids, topk_weights=None, out=None) -> y[M, top_k, N] for a grouped-MoE
    problem: w is an FP4Weight with packed [E, N, K/2], scales [E, N, K/G] and a global scale of
    shape () or [E]. The routing is aligned on the device without a host sync (graph-capturable):
    pairs sorted by expert (stable), each expert's run padded to BLOCK_M, one expert id per row
    block; the grid is sized by the bound ceil(P/BM) + min(E, P) row blocks and blocks past the
    padded total exit at once."""

    smem_model = None

    def __init__(self, problem: Any, params: dict[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.smem_compiled: int | None = None
        self.compiled = None
        interp = is_interpreting()
        fmt = problem.w_fmt
        self._consts = {"BLOCK_M": params["block_m"], "BLOCK_N": params["block_n"], "BLOCK_K": params["block_k"],
                        "SCALE_GROUP": 16 if fmt == "nvfp4" else 32, "SCALE_E4M3": 1 if fmt == "nvfp4" else 0,
                        "DEQ_ASM": 0 if interp else 1, "DOT_F32": 1 if interp else 0}

    def align(self, topk_ids):
        """(sorted pair ids padded with P, expert id per row block, padded total) on the device."""
        import torch
        bm, e_count = self.params["block_m"], self.problem.experts
        flat = topk_ids.reshape(-1).to(torch.int64)
        # -1 (expert not on this rank) sorts into a virtual expert E past the real ones: its pairs
        # land beyond `npad`, so their row blocks exit at once and do no work
        flat = torch.where(flat < 0, e_count, flat)
        p = flat.numel()
        dev = flat.device
        counts = torch.zeros(e_count + 1, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + bm - 1) // bm * bm
        ends = torch.cumsum(padded, 0)
        order = torch.argsort(flat, stable=True)
        sorted_e = flat[order]
        rank = torch.arange(p, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
        dest = (ends - padded)[sorted_e] + rank
        blocks = -(-p // bm) + min(e_count + 1, p)
        sorted_ids = torch.full((blocks * bm,), p, dtype=torch.int32, device=dev)
        sorted_ids[dest] = order.to(torch.int32)
        starts = torch.arange(blocks, device=dev, dtype=torch.int64) * bm
        expert_ids = torch.searchsorted(ends, starts, right=True).clamp_(max=e_count - 1).to(torch.int32)
        npad = ends[e_count - 1:e_count].to(torch.int32)     # real experts only
        return sorted_ids, expert_ids, npad, blocks

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None):
        import torch
        import triton

        from .kernel import moe_w4a16_kernel

        prob, p = self.problem, self.params
        fmt = getattr(w, "fmt", prob.w_fmt)
        if fmt != prob.w_fmt:
            raise ValueError(f"weight format {fmt} does not match the problem's {prob.w_fmt}")
        if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != prob.k:
            raise ValueError(f"x must be a bf16 [M, {prob.k}] tensor, got {tuple(x.shape)} {x.dtype}")
        e_count, n, k = prob.experts, prob.n, prob.k
        if tuple(w.packed.shape) != (e_count, n, k // 2):
            raise ValueError(f"packed weight {tuple(w.packed.shape)} is not [E={e_count}, N={n}, K/2={k // 2}]")
        m, top_k = topk_ids.shape
        if m != x.shape[0] or top_k != prob.top_k:
            raise ValueError(f"topk_ids {tuple(topk_ids.shape)} does not fit x {tuple(x.shape)} and top_k={prob.top_k}")
        if out is None:
            out = torch.empty((m, top_k, n), dtype=torch.bfloat16, device=x.device)
        elif out.shape != (m, top_k, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor of shape {(m, top_k, n)}")
        if m == 0:
            return out
        scales = scales_u8(w)
        gs = fp32_scale(w.global_scale, x.device, e_count)   # one per expert (a scalar is broadcast)
        sorted_ids, expert_ids, npad, blocks = self.align(topk_ids)
        routed = topk_weights is not None
        tw = (topk_weights.to(torch.float32).reshape(-1).contiguous() if routed
              else torch.empty(1, dtype=torch.float32, device=x.device))
        grid = (blocks * triton.cdiv(n, p["block_n"]),)
        ck = moe_w4a16_kernel[grid](x.contiguous(), w.packed.contiguous(), scales, gs, out, sorted_ids, expert_ids,
                                    npad, tw, m * top_k, n, k, TOP_K=top_k, ROUTED_WEIGHT=int(routed), num_warps=p["num_warps"], num_stages=p["num_stages"],
                                    **self._consts)
        note_compiled(self, ck, x.device)
        out.masked_fill_((topk_ids < 0).unsqueeze(-1), 0)     # -1 slots: zero rows (no host sync)
        return out


def is_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
