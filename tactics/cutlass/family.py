"""The `cutlass` family: CUTLASS block-scaled FP4 GEMMs as FlashInfer builds them.

Tactics are self-describing CUTLASS kernels (tactics.cutlass.candidates.Kernel): the tile in
elements, schedule, swap_ab, scheduler, epilogue source, format and MMA path. They are never a
FlashInfer index; tactics.cutlass.flashinfer_map turns one into FlashInfer's integer tactic at
build time. The verdict is exact: the builder's stage count and the kernel's SharedStorageSize
as CUTLASS computes them (tactics.cutlass.smem, checked against nvcc), then whether the FlashInfer
release we execute through builds that kernel at all.

Execution: FlashInfer's `mm_fp4(..., backend="cutlass")` runner, called with our tactic's
integer, on SM100 and SM120/SM121 GPUs (it is the only path this family runs; none of those GPUs
is available to this project, so it has not run here). Grouped-MoE kernels are enumerated with
exact verdicts (TensorRT-LLM's SM120 and SM100 FP4 lists, the code FlashInfer's fused-MoE runner
bundles) but not executed: that runner computes a whole MoE block, not one grouped GEMM.
"""
from __future__ import annotations

from typing import Any, Callable

from autotune.core.tactic import Tactic, Verdict
from tactics.base import FamilyBase
from tactics.cutlass import flashinfer_map as fim
from tactics.cutlass import smem as sm
from tactics.cutlass.candidates import (EPILOGUE_C, FORMATS, KERNEL_ARCHS, MMAS, OPS, SCHEDULERS, SCHEDULES,
                                        Kernel, sm100_dense, sm100_moe, sm120_dense, sm120_moe)

NAME = "cutlass"
PARAMS = tuple(sorted(Kernel.__dataclass_fields__))
_CLUSTERS = ("1x1x1", "1x2x1", "2x1x1", "2x2x1", "1x4x1", "4x2x1", "2x4x1", "4x4x1")

_NO_CPU = "no CUDA GPU: CUTLASS FP4 kernels need an SM100 or SM120 GPU"
_NO_FI = "flashinfer is not installed (pip install 'fp4-autotune[flashinfer]')"


def kernel_arch_for(arch: Any) -> str | None:
    """Which CUTLASS kernel family runs on `arch`: sm120 kernels on 12.x, sm100 on 10.0."""
    if not getattr(arch, "is_gpu", False):
        return None
    if arch.cc[0] == 12:
        return "sm120"
    if arch.cc == (10, 0):
        return "sm100"
    return None


def arch_problem(arch: Any) -> str | None:
    """Why no CUTLASS FP4 kernel of this family runs on `arch`, or None."""
    if not getattr(arch, "is_gpu", False):
        return _NO_CPU
    if arch.cc[0] < 10:
        return f"{arch.name.upper()}: no FP4 tensor cores"
    if kernel_arch_for(arch) is None:
        return (f"{arch.name.upper()}: FlashInfer builds a separate CUTLASS module for it "
                f"(not modeled; this family covers SM100 and SM120/SM121)")
    return None


def availability(arch: Any, flashinfer_version: str | None) -> tuple[bool, str]:
    """available()'s decision for a live arch and the installed FlashInfer (None: not installed),
    separated from the probing so that each answer is testable."""
    why = arch_problem(arch)
    if why:
        return False, why
    if flashinfer_version is None:
        return False, _NO_FI
    if flashinfer_version.split("+")[0] != fim.FLASHINFER_VERSION:
        # the integer tactic indexes FlashInfer's getConfigs() list, known for one release only
        return False, (f"flashinfer {flashinfer_version} is installed; this family maps the CUTLASS tactic "
                       f"list of {fim.FLASHINFER_VERSION} (regenerate tactics/cutlass/flashinfer_map.py)")
    return True, ""


def problem_support(problem: Any) -> str | None:
    if problem.w_fmt not in ("nvfp4", "mxfp4"):
        return f"cutlass family multiplies FP4 weights, not {problem.w_fmt}"
    ok_a = {"nvfp4": ("bf16", "nvfp4"), "mxfp4": ("bf16", "mxfp4", "fp8")}[problem.w_fmt]
    if problem.a_fmt not in ok_a:
        return f"cutlass family takes {' or '.join(ok_a)} activations with {problem.w_fmt} weights, not {problem.a_fmt}"
    if problem.out_dtype != "bf16":
        return f"cutlass family writes bf16, not {problem.out_dtype}"
    return None


def _formats_for(problem: Any) -> tuple[str, ...]:
    """Kernel formats that compute this problem (bf16 activations are quantized on the fly)."""
    if problem.w_fmt == "nvfp4":
        return ("nvfp4",)
    if problem.kind == "grouped_moe":
        return ("mxfp8_mxfp4",)        # TRT-LLM's SM120 MXFP4 MoE: MXFP8 activations
    return ("mxfp4",)


class CutlassFamily(FamilyBase):
    name = NAME
    depends_on = ("flashinfer-python", "torch")

    def supports(self, problem: Any) -> str | None:
        return problem_support(problem)

    # ---- availability -------------------------------------------------------------------------
    def available(self, device: str) -> tuple[bool, str]:
        if str(device).startswith("cpu"):
            return False, _NO_CPU
        try:
            import torch
            if not torch.cuda.is_available():
                return False, _NO_CPU
            from autotune.core.arch import arch_for_cc
            arch = arch_for_cc(*torch.cuda.get_device_capability())
        except Exception as e:
            return False, f"cannot query the GPU: {e}"
        try:
            import flashinfer
            fi_version = str(getattr(flashinfer, "__version__", "unknown"))
        except ImportError:
            fi_version = None
        return availability(arch, fi_version)

    # ---- space --------------------------------------------------------------------------------
    def enumerate(self, problem: Any, arch: Any) -> list[Tactic]:
        ka = kernel_arch_for(arch)
        if ka is None or problem_support(problem):
            return []
        out: list[Kernel] = []
        for fmt in _formats_for(problem):
            if ka == "sm120":
                out += sm120_moe(fmt) if problem.kind == "grouped_moe" else sm120_dense(fmt)
            else:
                out += sm100_moe(fmt) if problem.kind == "grouped_moe" else sm100_dense(fmt)
        return [Tactic(NAME, k.params()) for k in out]

    def validate(self, tactic: Tactic) -> str | None:
        if tactic.family != NAME:
            return f"family is {tactic.family!r}, not {NAME!r}"
        p = tactic.params
        if tuple(sorted(p)) != PARAMS:
            return f"cutlass tactic needs exactly the parameters {PARAMS}, got {tuple(sorted(p))}"
        for k in ("tile_m", "tile_n", "tile_k"):
            if not isinstance(p[k], int) or isinstance(p[k], bool) or p[k] <= 0 or p[k] % 8:
                return f"{k} must be a positive multiple of 8 (elements), got {p[k]!r}"
        if not isinstance(p["swap_ab"], bool):
            return f"swap_ab must be a bool, got {p['swap_ab']!r}"
        for k, allowed in (("kernel_arch", KERNEL_ARCHS), ("op", OPS), ("format", FORMATS), ("mma", MMAS),
                           ("schedule", SCHEDULES), ("scheduler", SCHEDULERS), ("epilogue_c", EPILOGUE_C),
                           ("cluster", _CLUSTERS)):
            if p[k] not in allowed:
                return f"cutlass tactic {k}={p[k]!r} not in {allowed}"
        sm100 = p["kernel_arch"] == "sm100"
        if sm100 != (p["schedule"] in ("1sm", "2sm")):
            return f"schedule {p['schedule']!r} does not belong to {p['kernel_arch']} kernels"
        if sm100 and (p["schedule"] == "2sm") != (int(p["cluster"][0]) >= 2):
            return f"a {p['schedule']} kernel cannot run in cluster {p['cluster']} (2-SM needs cluster M >= 2)"
        if not sm100 and p["cluster"] != "1x1x1":
            return "SM120 kernels need cluster 1x1x1 (no multicast)"
        return None

    # ---- static judgement ---------------------------------------------------------------------
    def verdict(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        why = self.validate(tactic) or problem_support(problem) or arch_problem(arch)
        if why:
            return Verdict.reject(why)
        k = Kernel.from_params(tactic.params)
        ka = kernel_arch_for(arch)
        if k.kernel_arch != ka:
            return Verdict.reject(f"{k.kernel_arch} kernel on {arch.name} (needs {ka} kernels)")
        if (k.op == "grouped_moe") != (problem.kind == "grouped_moe"):
            return Verdict.reject(f"{k.op} kernel for a {problem.kind} problem")
        if k.format not in _formats_for(problem):
            return Verdict.reject(f"{k.format} kernel for {problem.a_fmt} x {problem.w_fmt}")
        rule = sm.builder_rule(k)
        if rule:
            return Verdict.reject(rule)
        s = sm.model(k)
        limit = arch.smem_per_block_optin
        if s.kernel_bytes is None:
            return Verdict.reject(
                f"builder picks {s.stages} stage(s) < {sm.MIN_STAGES[k.kernel_arch]}: ({s.capacity} - epilogue "
                f"{s.epilogue_carveout}) // stage {s.stage_bytes} B (compile error in CUTLASS {sm.CUTLASS_VERSION})",
                stages=s.stages, limit=limit)
        if s.kernel_bytes > limit:
            return Verdict.reject(f"SharedStorageSize {s.kernel_bytes} > {limit} B opt-in limit at {s.stages} stages "
                                  f"(launch fails)", smem=s.kernel_bytes, limit=limit, stages=s.stages)
        if fim.to_index(k) is None:
            return Verdict.reject(
                f"fits ({s.stages} stages, {s.kernel_bytes} of {limit} B) but FlashInfer {fim.FLASHINFER_VERSION}'s "
                f"{'fused-MoE path is not wired into this family' if k.op == 'grouped_moe' else 'mm_fp4 does not build it'}",
                smem=s.kernel_bytes, limit=limit, stages=s.stages)
        return Verdict.keep(s.kernel_bytes, limit, s.stages)

    def default(self, problem: Any, arch: Any) -> Tactic:
        ka = kernel_arch_for(arch) or "sm120"
        if ka == "sm120":
            return Tactic(NAME, fim.from_index("sm120", -1).params())
        return Tactic(NAME, fim.configs("sm100")[0].params())

    # ---- build --------------------------------------------------------------------------------
    def build(self, problem: Any, tactic: Tactic, device: str) -> Callable[..., Any]:
        why = self.validate(tactic) or problem_support(problem)
        if why:
            raise ValueError(why)
        ok, why = self.available(device)
        if not ok:
            raise RuntimeError(why)
        k = Kernel.from_params(tactic.params)
        index = fim.to_index(k)
        if index is None or problem.kind != "dense":
            raise RuntimeError(f"FlashInfer {fim.FLASHINFER_VERSION} does not build {k.smem_key} for mm_fp4")
        return FlashInferMmFp4(problem, k, index)


class FlashInferMmFp4:
    """kernel(x, w, out=None) through FlashInfer's CUTLASS mm_fp4 runner with a fixed tactic.

    x (bf16 [M, K]) is quantized to NVFP4 with FlashInfer's fp4_quantize under the weight's
    input_scale (1.0 when absent); w is an FP4Weight (NVFP4, linear scales), whose scales are
    swizzled to the 128x4 layout once here. alpha = input_scale * weight global scale.
    """

    def __init__(self, problem: Any, kernel: Kernel, index: int):
        import torch
        from flashinfer import fp4_quantize
        from flashinfer.gemm.gemm_base import get_cutlass_fp4_gemm_module
        major, minor = torch.cuda.get_device_capability()
        self.runner = get_cutlass_fp4_gemm_module(major, minor).cutlass_fp4_gemm_runner()
        n = len(self.runner.get_valid_tactics([], None))   # range(fp4_gemm_tactic_num()); ignores its inputs
        if n != len(fim.configs(kernel.kernel_arch)):
            raise RuntimeError(f"FlashInfer's CUTLASS module lists {n} tactics, the mapping "
                               f"{len(fim.configs(kernel.kernel_arch))}: index {index} would name another kernel")
        self.quantize = fp4_quantize
        self.problem, self.kernel, self.index = problem, kernel, index
        self.workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
        self._w: Any = None

    def _weight(self, w: Any) -> tuple[Any, Any, Any, float]:
        import torch
        from autotune.core.formats import swizzle_128x4
        if self._w is None or self._w[0] is not w:
            n, k = w.packed.shape
            b = w.packed.view(torch.uint8).T                        # (K/2, N) column-major view
            sf = swizzle_128x4(w.scales).view(torch.uint8).reshape(-1, (k // 16 + 3) // 4 * 4).T
            in_scale = float(w.input_scale) if getattr(w, "input_scale", None) is not None else 1.0
            self._w = (w, b, sf, in_scale)
        return self._w[1], self._w[2], self._w[3], float(w.global_scale)

    def __call__(self, x: Any, w: Any, out: Any = None) -> Any:
        import torch
        b, b_sf, in_scale, w_scale = self._weight(w)
        gs = torch.tensor([1.0 / in_scale], dtype=torch.float32, device=x.device)
        a, a_sf = self.quantize(x, gs, 16, False, True)
        alpha = torch.tensor([in_scale * w_scale], dtype=torch.float32, device=x.device)
        if out is None:
            out = torch.empty(x.shape[0], self.problem.n, dtype=torch.bfloat16, device=x.device)
        inputs = [a, b, a_sf, b_sf, alpha, torch.bfloat16, out, 16, True, self.workspace]
        self.runner.forward(inputs, tactic=self.index)
        return out
