"""Member `dequant_cublas`: a Triton kernel dequantizes the whole weight to bf16 (once per call),
then cuBLAS multiplies. It wins at large M, where the fused kernel's per-tile dequantization costs
more than a bf16 copy of the weight. One tile in the default space; no pipelined loop, so no
shared memory to model."""
from __future__ import annotations

from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from .bound_dense import BoundDequantCublas, Remember
from .args import is_interpreting, out_tensor, weight_args
from .member import FAMILY, SHARED_CODE, check_axes, grid, POW2_K, POW2_MN, WARPS_OK, scale_consts, w4a16_rules, w4a16_support

KERNEL = "dequant_cublas"
#: the one tile of the default space
TILE = {"block_n": 32, "block_k": 256, "num_warps": 4}


class DequantCublasMember:
    kernel = KERNEL
    #: this member's sources, keyed into its trials and winners (autotune.core.codekey)
    code = Code.of(f"triton/{KERNEL}", __package__, *SHARED_CODE, ".dequant_cublas",
                   ".kernel", ".bound_dense", ".splitk", ".smem", ".direct")
    compat_kernel = KERNEL
    schema = {"kernel": (KERNEL,), "block_n": POW2_MN, "block_k": POW2_K, "num_warps": WARPS_OK}

    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """No: cuBLAS picks its algorithm (and K order) per shape."""
        return False

    def supports(self, problem: Problem) -> str | None:
        return w4a16_support(problem, KERNEL, "dense")

    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> list[Tactic]:
        return [Tactic(FAMILY, kernel=KERNEL, **g) for g in grid({k: (v,) for k, v in TILE.items()}, axes)]

    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        check_axes(KERNEL, {k: (v,) for k, v in TILE.items()}, self.schema, axes)

    def default(self, problem: Problem, arch: Arch) -> None:
        return None         # never the default: it pays a bf16 copy of the weight per call

    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        return w4a16_rules(problem, params, arch, pipelined=False)

    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> None:
        return None

    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return 0

    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> None:
        return None         # nothing modelled: no figure to check

    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list:
        return []           # compiled by its first launch (one small kernel)

    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> "DequantCublasLauncher":
        return DequantCublasLauncher(problem, tactic.params)


MEMBER = DequantCublasMember()


class DequantCublasLauncher(Remember):
    """kernel(x, w, out=None) -> y: a Triton kernel dequantizes W (FP4Weight or U8Weight) to a bf16
    [N, K] buffer the launcher owns (global scale folded in), then torch.matmul (cuBLAS)
    multiplies. Pays N·K·2 bytes written and read per call, so it only wins where the GEMM itself
    dominates (large M)."""

    smem_compiled = None        # no pipelined loop, nothing for the smem model to answer for
    smem_model = None

    bound_cls = BoundDequantCublas

    def __init__(self, problem: Problem, params: Mapping[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self._wbuf = None
        self._consts = {"BLOCK_N": params["block_n"], "BLOCK_K": params["block_k"], **scale_consts(problem.w_fmt),
                        "DEQ_ASM": 0 if is_interpreting() else 1}

    def release(self) -> None:
        """The bf16 weight buffer."""
        super().release()
        self._wbuf = None

    def launch(self, x, w, out=None):
        """Triton's own launch (the route every call took before #17; bound launchers fall back to it)."""
        import torch
        import triton

        from .kernel import dequant_bf16_kernel

        prob, p = self.problem, self.params
        m, n, k, packed, scales, gs = weight_args(prob, x, w)
        out = out_tensor(out, (m, n), x)
        if m == 0:
            return out
        if self._wbuf is None or self._wbuf.device != x.device:
            self._wbuf = torch.empty((n, k), dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(n, p["block_n"]), k // p["block_k"])
        dequant_bf16_kernel[grid](packed, scales, gs, self._wbuf, n, k, num_warps=p["num_warps"], **self._consts)
        torch.matmul(x, self._wbuf.T, out=out)
        return out
