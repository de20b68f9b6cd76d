"""The W4A4 member of the `triton` family: `w4a4_dot_scaled`.

A W4A4 problem is a dense problem whose activations are FP4 in the weight's format
(`a_fmt == w_fmt`, "nvfp4" or "mxfp4"): y = dequant(quant(x)) · dequant(W)ᵀ. The launcher
quantizes the bf16 activations with our Triton kernel (w4a4_kernels.act_quant_kernel; NVFP4 under
the checkpoint's static `input_scale`, MXFP4 with e8m0 scales and no global scale), then runs the
`tl.dot_scaled` GEMM with two packed e2m1 operands, fp32 accumulation, both global scales in the
epilogue and a bf16 output. **A call includes the activation quantization** (two launches:
quantize, then GEMM); `W4A4Launcher.quantize` and `.gemm` run the halves alone for timing.

Lowering (Triton 3.9.0, cross-compiled): native `mma.sync … kind::mxf4nvf4` on sm120/sm121,
`tcgen05.mma … kind::mxf4nvf4` / `kind::mxf4` on sm100 at BLOCK_M = 128 (BLOCK_M = 64: bf16
tcgen05 on upcast operands, smaller: bf16 mma.sync), emulated by a bf16 upcast on sm89 (mma.sync)
and sm90 (wgmma; mma.sync below BLOCK_M = 64). NVFP4 does not compile on sm80/86 (no fp8e4nv
type) nor on sm90 with Triton < 3.7 (compat.py).

This module imports no Triton at import time (verdicts are pure); the kernels live in
w4a4_kernels.py, the smem/tmem model in smem_w4a4.py.
"""
from __future__ import annotations

from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from autotune.tactics.base import LauncherBase

from .args import fp32_scale, note_compiled, scales_u8
from .compile import ast_source
from .member import FAMILY, GROUP, SHARED_CODE, check_axes, grid, tile_rules
from .smem_w4a4 import smem_bytes, tmem_columns

KERNEL = "w4a4_dot_scaled"
#: the domain the smem model was fitted on (every point of it cross-compiled, Triton 3.9)
BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (128, 256)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)
GRID = {"block_m": BLOCK_M, "block_n": BLOCK_N, "block_k": BLOCK_K, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
GROUP_M = 8
#: activation-quantization tile (fixed): 32 rows × 128 columns per program
QUANT_BLOCK_M = 32
QUANT_BLOCK_K = 128
#: what a call of the launcher times (the bench reports it beside the result)
INCLUDES_ACTIVATION_QUANT = True


def silly(bm: int, bn: int, bk: int, warps: int) -> bool:
    if warps == 8 and bm * bn < 64 * 128:        # idle warps on a small tile
        return True
    if warps == 4 and bm * bn >= 128 * 256:      # 128x256 fp32 accumulator on 128 threads: spills
        return True
    return False


def _options(params: Mapping[str, Any]) -> dict[str, int]:
    return {"num_warps": int(params["num_warps"]), "num_stages": int(params["num_stages"])}


def gemm_source(fmt: str, params: Mapping[str, Any]):
    """(ASTSource, options) of the GEMM with the launcher's specialization. Imports Triton."""
    from .w4a4_kernels import GEMM_ARG_NAMES, GEMM_DIVISIBLE, gemm_arg_types, w4a4_gemm_kernel     # imports Triton
    consts = {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]),
              "BLOCK_K": int(params["block_k"]), "GROUP_M": GROUP_M, "SCALE_GROUP": GROUP[fmt]}
    src = ast_source(w4a4_gemm_kernel, GEMM_ARG_NAMES, gemm_arg_types(fmt), GEMM_DIVISIBLE, consts)
    return src, _options(params)


def quant_source(fmt: str):
    """(ASTSource, options) of the activation quantizer (one fixed tile). Imports Triton."""
    from .w4a4_kernels import QUANT_ARG_NAMES, QUANT_ARG_TYPES, QUANT_DIVISIBLE, act_quant_kernel     # imports Triton
    consts = {"BLOCK_M": QUANT_BLOCK_M, "BLOCK_K": QUANT_BLOCK_K, "SCALE_GROUP": GROUP[fmt],
              "SCALE_E4M3": 1 if fmt == "nvfp4" else 0}
    src = ast_source(act_quant_kernel, QUANT_ARG_NAMES, QUANT_ARG_TYPES, QUANT_DIVISIBLE, consts)
    return src, {"num_warps": 4, "num_stages": 1}


class W4A4Member:
    kernel = KERNEL
    compat_kernel = "dot_scaled"
    #: this member's sources, keyed into its trials and winners (autotune.core.codekey)
    code = Code.of(f"triton/{KERNEL}", __package__, *SHARED_CODE, ".w4a4", ".w4a4_kernels", ".smem", ".smem_w4a4")
    schema = {"kernel": (KERNEL,), "block_m": BLOCK_M, "block_n": BLOCK_N, "block_k": BLOCK_K,
              "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}

    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """Not claimed: no test holds its rows bit-identical across M."""
        return False

    def supports(self, problem: Problem) -> str | None:
        if problem.kind != "dense":
            return f"triton w4a4 kernel handles dense problems, not {problem.kind!r}"
        if problem.w_fmt not in GROUP or problem.a_fmt != problem.w_fmt:
            return (f"triton w4a4 kernel needs FP4 activations in the weight's format (nvfp4*nvfp4 or "
                    f"mxfp4*mxfp4), not {problem.a_fmt}*{problem.w_fmt}")
        if problem.out_dtype != "bf16":
            return f"triton w4a4 kernel writes bf16, not {problem.out_dtype}"
        if problem.epilogue != "none":
            return f"triton w4a4 kernel has no {problem.epilogue} epilogue"
        return None

    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> list[Tactic]:
        return [Tactic(FAMILY, kernel=KERNEL, **g) for g in grid(GRID, axes)
                if not silly(g["block_m"], g["block_n"], g["block_k"], g["num_warps"])]

    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        check_axes(KERNEL, GRID, self.schema, axes)     # the schema is the fitted domain: no wider

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        bk = 256 if problem.k % 256 == 0 else 128
        return Tactic(FAMILY, kernel=KERNEL, block_m=64, block_n=128, block_k=bk, num_warps=4, num_stages=3)

    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        if silly(params["block_m"], params["block_n"], params["block_k"], params["num_warps"]):
            return "config pruned from the space (idle warps or accumulator spills); the smem model is not checked there"
        why = tile_rules(problem, params["block_k"])
        if why or not arch.is_gpu:
            return why
        if arch.cc[0] < 8:
            return f"{arch.name}: tl.dot_scaled needs sm80 or newer"
        if problem.w_fmt == "nvfp4" and arch.cc < (8, 9):
            # Triton 3.9.0, cross-compiled for sm80: the e4m3 scale pointer does not lower
            return (f"{arch.name}: NVFP4 e4m3 scales need sm89 or newer "
                    "(Triton: type fp8e4nv not supported in this architecture)")
        return None

    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return smem_bytes(params, fmt, arch)

    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return tmem_columns(params, fmt, arch)

    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> None:
        return None     # the schema is the fitted domain: every valid config was cross-compiled

    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list[tuple[Any, dict]]:
        return [quant_source(fmt), gemm_source(fmt, params)]

    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> "W4A4Launcher":
        return W4A4Launcher(problem, tactic.params)


MEMBER = W4A4Member()


class W4A4Launcher(LauncherBase):
    """kernel(x, w, out=None) -> y: quantize x (bf16 [M, K]) with our Triton kernel, then the
    dot_scaled GEMM. `w` is an FP4Weight (or the family's U8Weight pack) in the problem's format; NVFP4 quantizes under
    `w.input_scale` (the checkpoint's static activation global scale), 1.0 when the weight has none
    — the cutlass and cublaslt families' convention, so every W4A4 family computes the same
    function of the same inputs. MXFP4 activations have no global scale (OCP MX): `w.input_scale`
    is not read for them.

    `includes_activation_quant` is True: a call's time is quantize + GEMM. `quantize(x, w)` and
    `gemm(xq, xs, w, out)` run the halves alone. The launcher owns the quantized-activation
    buffers (grown on demand; one call at a time per launcher). After the first compiled call,
    `smem_compiled` holds the GEMM's `metadata.shared` and `smem_model` the model's figure.
    """

    includes_activation_quant = INCLUDES_ACTIVATION_QUANT

    def __init__(self, problem: Any, params: Mapping[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.fmt = problem.w_fmt
        self.group = 16 if self.fmt == "nvfp4" else 32
        self.smem_compiled: int | None = None
        self.smem_model: int | None = None
        self.compiled = None
        self._bufs = None
        self._retired: list = []    # outgrown buffers: a CUDA graph captured earlier still points at them
        self._one = None

    def release(self) -> None:
        """The quantized-activation buffers and the outgrown ones."""
        self._bufs = self._one = None
        self._retired.clear()

    def _check(self, x, w):
        import torch
        fmt = getattr(w, "fmt", None)
        if fmt != self.fmt:
            raise ValueError(f"weight format {fmt} does not match the problem's {self.fmt}")
        if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != self.problem.k:
            raise ValueError(f"x must be a bf16 [M, {self.problem.k}] tensor, got {tuple(x.shape)} {x.dtype}")
        if tuple(w.packed.shape) != (self.problem.n, self.problem.k // 2):
            raise ValueError(f"packed weight {tuple(w.packed.shape)} is not [N={self.problem.n}, K/2={self.problem.k // 2}]")

    def _input_scale(self, w, device):
        if self.fmt == "nvfp4":
            return fp32_scale(input_scale_of(w), device)
        if self._one is None or self._one.device != device:
            import torch
            self._one = torch.ones(1, dtype=torch.float32, device=device)
        return self._one

    def quantize(self, x, w):
        """(packed uint8 [M, K/2], scales [M, K/G]: float8_e4m3fn (NVFP4) or uint8 e8m0 (MXFP4))."""
        import torch
        import triton

        from .w4a4_kernels import act_quant_kernel

        self._check(x, w)
        m, k = x.shape
        if self._bufs is None or self._bufs[0].shape[0] < m or self._bufs[0].device != x.device:
            rows = max(m, 16)
            if self._bufs is not None:
                self._retired.append(self._bufs)
            self._bufs = (torch.empty((rows, k // 2), dtype=torch.uint8, device=x.device),
                          torch.empty((rows, k // self.group), dtype=torch.uint8, device=x.device))
        q, s = self._bufs[0][:m], self._bufs[1][:m]
        if m:
            grid = (triton.cdiv(m, QUANT_BLOCK_M), k // QUANT_BLOCK_K)
            act_quant_kernel[grid](x.contiguous(), q, s, self._input_scale(w, x.device), m, k,
                                   BLOCK_M=QUANT_BLOCK_M, BLOCK_K=QUANT_BLOCK_K, SCALE_GROUP=self.group,
                                   SCALE_E4M3=1 if self.fmt == "nvfp4" else 0, num_warps=4)
        return q, (s.view(torch.float8_e4m3fn) if self.fmt == "nvfp4" else s)

    def gemm(self, xq, xs, w, out=None):
        import torch
        import triton

        from .w4a4_kernels import w4a4_gemm_kernel

        prob, p = self.problem, self.params
        m, n = xq.shape[0], prob.n
        if out is None:
            out = torch.empty((m, n), dtype=torch.bfloat16, device=xq.device)
        elif out.shape != (m, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor of shape {(m, n)}")
        if m == 0:
            return out
        # the scale pointer's type tells dot_scaled the scale format: e4m3 (NVFP4) or e8m0 bytes
        ws = scales_u8(w)
        if self.fmt == "nvfp4":
            ws = ws.view(torch.float8_e4m3fn)
        grid = (triton.cdiv(m, p["block_m"]) * triton.cdiv(n, p["block_n"]),)
        ck = w4a4_gemm_kernel[grid](xq, xs, w.packed.contiguous(), ws, self._input_scale(w, xq.device),
                                    fp32_scale(w.global_scale, xq.device), out, m, n, prob.k,
                                    BLOCK_M=p["block_m"], BLOCK_N=p["block_n"], BLOCK_K=p["block_k"],
                                    GROUP_M=GROUP_M, SCALE_GROUP=self.group,
                                    num_warps=p["num_warps"], num_stages=p["num_stages"])
        note_compiled(self, ck, xq.device, lambda arch: smem_bytes(p, self.fmt, arch))
        return out

    def __call__(self, x, w, out=None):
        q, s = self.quantize(x, w)
        return self.gemm(q, s, w, out)


def input_scale_of(w):
    """The NVFP4 activation global scale of a weight: its input_scale, or 1.0 (see W4A4Launcher)."""
    import torch
    if w.input_scale is None:
        return torch.ones((), dtype=torch.float32, device=w.packed.device)
    return w.input_scale
