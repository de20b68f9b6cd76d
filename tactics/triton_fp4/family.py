"""The `triton` tactic family: the W4A16 dequantize-in-registers GEMM of kernel.py.

verdict() is pure: it imports nothing from Triton and never compiles; the shared-memory check uses
the static model in smem.py (checked against Triton 3.9.0's `metadata.shared`).
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable

from tactics.base import Tactic, Verdict

from . import smem as _smem

NAME = "triton"
KERNEL = "w4a16_dequant"
PARAMS = ("block_k", "block_m", "block_n", "group_m", "kernel", "num_stages", "num_warps")

BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (64, 128, 256)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4, 5)
GROUP_M = (1, 8)

_POW2_MN = (16, 32, 64, 128, 256)
_POW2_K = (64, 128, 256, 512)
_WARPS_OK = (1, 2, 4, 8, 16)
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
    if getattr(problem, "kind", None) != "dense":
        return f"triton w4a16 kernel handles dense problems only, not {getattr(problem, 'kind', None)!r}"
    if problem.a_fmt != "bf16":
        return f"triton w4a16 kernel needs bf16 activations, not {problem.a_fmt}"
    if problem.w_fmt not in ("nvfp4", "mxfp4"):
        return f"triton w4a16 kernel needs nvfp4/mxfp4 weights, not {problem.w_fmt}"
    if problem.out_dtype != "bf16":
        return f"triton w4a16 kernel writes bf16, not {problem.out_dtype}"
    return None


class TritonFamily:
    name = NAME
    depends_on: tuple[str, ...] = ("triton",)

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
        if _supported(problem) is not None:
            return []
        out = []
        for bm, bn, bk, warps, stages, gm in itertools.product(BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS,
                                                               NUM_STAGES, GROUP_M):
            if bk < MIN_BLOCK_K[problem.w_fmt] or _silly(bm, bn, bk, warps, stages):
                continue
            out.append(self._tactic(bm, bn, bk, gm, warps, stages))
        return out

    @staticmethod
    def _tactic(bm: int, bn: int, bk: int, gm: int, warps: int, stages: int) -> Tactic:
        return Tactic(NAME, kernel=KERNEL, block_m=bm, block_n=bn, block_k=bk, group_m=gm,
                      num_warps=warps, num_stages=stages)

    def validate(self, tactic: Tactic) -> str | None:
        if tactic.family != NAME:
            return f"family is {tactic.family!r}, not {NAME!r}"
        p = tactic.params
        if tuple(sorted(p)) != PARAMS:
            return f"triton tactic needs exactly the parameters {PARAMS}, got {tuple(sorted(p))}"
        if p["kernel"] != KERNEL:
            return f"unknown triton kernel {p['kernel']!r} (known: {KERNEL!r})"
        for k in ("block_k", "block_m", "block_n", "group_m", "num_stages", "num_warps"):
            v = p[k]
            if not isinstance(v, int) or isinstance(v, bool):
                return f"{k} must be an int, got {v!r}"
        if p["block_m"] not in _POW2_MN or p["block_n"] not in _POW2_MN:
            return f"block_m/block_n must be one of {_POW2_MN}"
        if p["block_k"] not in _POW2_K:
            return f"block_k must be one of {_POW2_K}"
        if p["num_warps"] not in _WARPS_OK:
            return f"num_warps must be one of {_WARPS_OK}"
        if not 1 <= p["num_stages"] <= 8:
            return "num_stages must be in 1..8"
        if not 1 <= p["group_m"] <= 64:
            return "group_m must be in 1..64"
        return None

    # ---- static judgement ---------------------------------------------------------------------
    def verdict(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        why = self.validate(tactic) or _supported(problem)
        if why:
            return Verdict.reject(why)
        p = tactic.params
        bk, stages = p["block_k"], p["num_stages"]
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
        if stages < 2:
            return Verdict.reject("num_stages must be >= 2 (the smem model covers pipelined loops only)",
                                  stages=stages)
        if not getattr(arch, "is_gpu", True):
            return Verdict.keep(stages=stages)          # cpu pseudo-arch: interpreter, no smem limit
        if arch.cc[0] < 8:
            return Verdict.reject(f"{arch.name}: the kernel needs sm80 or newer (bf16 tl.dot)", stages=stages)
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
        k = getattr(problem, "k", 128)
        bk = next((b for b in (128, 64, 256) if k % b == 0 and b >= MIN_BLOCK_K.get(problem.w_fmt, 64)), 128)
        return self._tactic(64, 64, bk, 8, 4, 3)

    # ---- build --------------------------------------------------------------------------------
    def build(self, problem: Any, tactic: Tactic, device: str) -> Callable[..., Any]:
        why = self.validate(tactic) or _supported(problem)
        if not why and problem.k % tactic["block_k"]:
            # the kernel does not mask K: such a config would read past each weight row
            why = f"block_k {tactic['block_k']} does not divide K={problem.k}"
        if why:
            raise ValueError(why)
        return W4A16Launcher(problem, tactic.params)


class W4A16Launcher:
    """kernel(x, w, out=None) -> y. `w` has .packed, .scales, .global_scale, .fmt (FP4Weight).

    After the first call, `smem_compiled` holds the compiled kernel's `metadata.shared` (None
    under TRITON_INTERPRET=1, where nothing is compiled) and `smem_model` the static model's value
    for the device's arch.
    """

    def __init__(self, problem: Any, params: dict[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.smem_compiled: int | None = None
        self.smem_model: int | None = None
        self.compiled = None
        from .compile import constexprs_for
        # resolved once per launcher, not per call: dispatch calls this on every GEMM
        self._consts = {**constexprs_for(problem.w_fmt, self.params), "DOT_F32": 1 if is_interpreting() else 0}

    def __call__(self, x, w, out=None):
        import torch
        import triton

        from .kernel import w4a16_dequant_kernel

        prob, p = self.problem, self.params
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
        x = x.contiguous()
        packed = w.packed.contiguous()
        scales = w.scales.contiguous()
        if scales.dtype != torch.uint8:
            scales = scales.view(torch.uint8)
        gs = w.global_scale
        if not torch.is_tensor(gs):
            gs = torch.tensor(float(gs), dtype=torch.float32, device=x.device)
        gs = gs.to(device=x.device, dtype=torch.float32).reshape(1).contiguous()
        if out is None:
            out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
        elif out.shape != (m, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor of shape {(m, n)}")
        if m == 0:
            return out
        bm, bn = p["block_m"], p["block_n"]
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        ck = w4a16_dequant_kernel[grid](x, packed, scales, gs, out, m, n, k,
                                        num_warps=p["num_warps"], num_stages=p["num_stages"],
                                        **self._consts)
        if self.compiled is None and ck is not None and hasattr(ck, "metadata"):
            self.compiled = ck
            self.smem_compiled = int(ck.metadata.shared)
            if x.is_cuda:
                from tactics.arch import arch_for_cc
                try:
                    self.smem_model = _smem.smem_bytes(p, prob.w_fmt, arch_for_cc(*torch.cuda.get_device_capability(x.device)))
                except ValueError:
                    self.smem_model = None
        return out


def is_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
