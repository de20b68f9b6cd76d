"""The `cutlass` family: CUTLASS block-scaled FP4 GEMMs as FlashInfer builds them.

Tactics are self-describing CUTLASS kernels (autotune.tactics.cutlass.candidates.Kernel): the tile in
elements, schedule, swap_ab, scheduler, epilogue source, format and MMA path. They are never a
FlashInfer index; autotune.tactics.cutlass.flashinfer_map turns one into FlashInfer's integer tactic at
build time. The verdict is the compiler's: the builder's stage count and the kernel's
SharedStorageSize from the committed nvcc truth table (autotune.tactics.cutlass.truth; autotune.tactics.cutlass.smem
explains every row), then whether the FlashInfer release we execute through builds that kernel at
all. A kernel that was never compiled gets `unknown`, never a figure extrapolated by the model.

Execution: FlashInfer's `mm_fp4(..., backend="cutlass")` runner, called with our tactic's
integer, on SM100 and SM120/SM121 GPUs (it is the only path this family runs; none of those GPUs
is available to this project, so it has not run here). Grouped-MoE kernels are enumerated with
exact verdicts (TensorRT-LLM's SM120 and SM100 FP4 lists, the code FlashInfer's fused-MoE runner
bundles) but not executed: that runner computes a whole MoE block, not one grouped GEMM.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from autotune.core.codekey import Code
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import FamilyBase, LauncherBase
from autotune.tactics.cutlass import flashinfer_map as fim
from autotune.tactics.cutlass import smem as sm
from autotune.tactics.cutlass import truth
from autotune.tactics.cutlass.candidates import (EPILOGUE_C, FORMATS, KERNEL_ARCHS, MMAS, OPS, SCHEDULERS, SCHEDULES,
                                        Kernel, sm100_dense, sm100_moe, sm120_dense, sm120_moe)
from autotune.tactics.swizzled import SwizzledCache, SwizzledLayout, SwizzledWeight, check_bound_weight

NAME = "cutlass"
_CLUSTERS = ("1x1x1", "1x2x1", "2x1x1", "2x2x1", "1x4x1", "4x2x1", "2x4x1", "4x4x1")
#: exactly these parameters (Kernel's fields); tiles are further checked in `validate`
SCHEMA = {"kernel_arch": KERNEL_ARCHS, "op": OPS, "tile_m": int, "tile_n": int, "tile_k": int, "format": FORMATS,
          "mma": MMAS, "schedule": SCHEDULES, "scheduler": SCHEDULERS, "epilogue_c": EPILOGUE_C, "swap_ab": bool,
          "cluster": _CLUSTERS}

#: the workspace FlashInfer's CUTLASS runner is handed (what mm_fp4 allocates)
WORKSPACE_BYTES = 32 << 20
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
    if getattr(problem, "epilogue", "none") != "none":
        return f"cutlass family has no {problem.epilogue} epilogue"
    return None


def _formats_for(problem: Any) -> tuple[str, ...]:
    """Kernel formats that compute this problem (bf16 activations are quantized on the fly)."""
    if problem.w_fmt == "nvfp4":
        return ("nvfp4",)
    if problem.kind == "grouped_moe":
        return ("mxfp8_mxfp4",)        # TRT-LLM's SM120 MXFP4 MoE: MXFP8 activations
    return ("mxfp4",)


class CutlassFamily(SwizzledLayout, FamilyBase):
    name = NAME
    #: the sources its measured numbers depend on: kernel, launch and pack code (autotune.core.codekey)
    CODE = Code.of(NAME, __package__, ".family", ".candidates", ".flashinfer_map", ".smem", ".truth", "..base", "..swizzled",
                   "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats", "autotune.core.jsonread", "autotune.core.operands", "autotune.core.problem", "autotune.core.tactic")
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
        why = check_params(tactic, SCHEMA, "cutlass")
        if why:
            return why
        p = tactic.params
        for k in ("tile_m", "tile_n", "tile_k"):
            if p[k] <= 0 or p[k] % 8:
                return f"{k} must be a positive multiple of 8 (elements), got {p[k]!r}"
        sm100 = p["kernel_arch"] == "sm100"
        if sm100 != (p["schedule"] in ("1sm", "2sm")):
            return f"schedule {p['schedule']!r} does not belong to {p['kernel_arch']} kernels"
        if sm100 and (p["schedule"] == "2sm") != (int(p["cluster"][0]) >= 2):
            return f"a {p['schedule']} kernel cannot run in cluster {p['cluster']} (2-SM needs cluster M >= 2)"
        if not sm100 and p["cluster"] != "1x1x1":
            return "SM120 kernels need cluster 1x1x1 (no multicast)"
        return None

    # ---- static judgement ---------------------------------------------------------------------
    def verdict_checked(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        why = arch_problem(arch)
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
        return smem_verdict(k, arch.smem_per_block_optin)

    def default(self, problem: Any, arch: Any) -> Tactic:
        ka = kernel_arch_for(arch) or "sm120"
        if ka == "sm120":
            return Tactic(NAME, fim.from_index("sm120", -1).params())
        return Tactic(NAME, fim.configs("sm100")[0].params())

    # ---- build --------------------------------------------------------------------------------
    def build(self, problem: Any, tactic: Tactic, device: str) -> Any:
        why = self.validate(tactic) or problem_support(problem)
        if why:
            raise ValueError(why)
        k = Kernel.from_params(tactic.params)
        if problem.kind != "dense" or k.op != "dense":
            # no grouped launcher: FlashInfer's cutlass_fused_moe runs a whole MoE block
            raise RuntimeError(f"cutlass family runs dense GEMMs only: grouped-MoE kernels are judged, not run "
                               f"(FlashInfer {fim.FLASHINFER_VERSION}'s fused-MoE path is not wired in)")
        index = fim.to_index(k)
        if index is None:
            raise RuntimeError(f"FlashInfer {fim.FLASHINFER_VERSION} does not build {k.smem_key} for mm_fp4")
        ok, why = self.available(device)
        if not ok:
            raise RuntimeError(why)
        return FlashInferMmFp4(problem, k, index)


def smem_verdict(k: Kernel, limit: int) -> Verdict:
    """The verdict nvcc's row gives (tactics/cutlass/smem_truth.json); unknown without a row."""
    r = truth.row(k)
    src = f"nvcc, CUTLASS {sm.CUTLASS_VERSION}"
    if r is None:
        built = "" if fim.to_index(k) is not None else f"; FlashInfer {fim.FLASHINFER_VERSION} does not build it either"
        return Verdict(None, f"unknown: {k.smem_key} was never compiled (no row in the nvcc truth table for "
                             f"CUTLASS {sm.CUTLASS_VERSION}; add it with tools/cutlass_smem_truth/gen.py){built}")
    err = truth.compile_error(r)
    if r["kernel_smem"] is None:
        if r["stages"] is None:
            return Verdict.reject(f"does not compile ({src}): {err}")
        return Verdict.reject(
            f"builder picks {r['stages']} stage(s) < {sm.MIN_STAGES[k.kernel_arch]} with the {r['epi_smem']} B "
            f"epilogue carve-out: compile error ({src}{': ' + err.split('error: ')[-1] if err else ''})",
            stages=r["stages"], limit=limit)
    smem, stages = r["kernel_smem"], r["stages"]
    if smem > limit:
        return Verdict.reject(f"SharedStorageSize {smem} > {limit} B opt-in limit at {stages} stages "
                              f"(launch fails; {src})", smem=smem, limit=limit, stages=stages)
    if fim.to_index(k) is None:
        return Verdict.reject(
            f"fits ({stages} stages, {smem} of {limit} B) but FlashInfer {fim.FLASHINFER_VERSION}'s "
            f"{'fused-MoE path is not wired into this family' if k.op == 'grouped_moe' else 'mm_fp4 does not build it'}",
            smem=smem, limit=limit, stages=stages)
    return Verdict.keep(smem, limit, stages)


class FlashInferMmFp4(LauncherBase):
    """kernel(x, w, out=None) through FlashInfer's CUTLASS mm_fp4 runner with a fixed tactic.

    x (bf16 [M, K]) is quantized to NVFP4 with FlashInfer's fp4_quantize under the weight's
    input_scale (1.0 when absent); w is the packed SwizzledWeight (bound launchers: no swizzle
    here) or an FP4Weight, swizzled once per weight object. alpha = input_scale * weight global scale.
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
        self.workspace: Any = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._weight = WeightOperands(problem)

    def release(self) -> None:
        """The CUTLASS workspace and the per-weight operand views (made again by a later call)."""
        self.workspace = None
        self._weight = WeightOperands(self.problem)

    def __call__(self, x: Any, w: Any, out: Any = None) -> Any:
        import torch
        if x.ndim != 2 or x.shape[1] != self.problem.k:
            raise ValueError(f"cutlass: activation {tuple(x.shape)} does not match the problem's K={self.problem.k}")
        ops = self._weight(w)                  # per weight object: views, scalars, their device tensors
        a, a_sf = self.quantize(x, ops.gs, 16, False, True)
        if out is None:
            out = torch.empty(x.shape[0], self.problem.n, dtype=torch.bfloat16, device=x.device)
        if self.workspace is None:
            self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        inputs = [a, ops.b, a_sf, ops.sf, ops.alpha, torch.bfloat16, out, 16, True, self.workspace]
        self.runner.forward(inputs, tactic=self.index)
        return out


class FlashInferOperands(NamedTuple):
    b: Any              # (K/2, N) column-major uint8 view of the packed codes
    sf: Any             # (C, R) view of the 128x4 block scales
    in_scale: float
    w_scale: float
    gs: Any             # fp32 [1] = 1 / in_scale on the weight's device (fp4_quantize's global scale)
    alpha: Any          # fp32 [1] = in_scale * w_scale on the weight's device


class WeightOperands:
    """w -> the runner's weight operands, prepared (and checked against the problem) once per
    weight object: a bound launcher's packed weight is never swizzled again, and its two scalars
    are read to the host (a sync) and put back on the device as tensors once, not on every call
    (which also kept the call out of CUDA-graph capture: torch.tensor(..., device=cuda) copies)."""

    def __init__(self, problem: Any):
        self.problem = problem
        self._swizzled = SwizzledCache()
        self._ops: Any = None

    def __call__(self, w: Any) -> FlashInferOperands:
        sw = self._swizzled(w)
        if self._ops is None or self._ops[0] is not sw:
            check_bound_weight(self.problem, sw, NAME)
            import torch
            b, sf, in_scale, w_scale = flashinfer_weight(sw)
            dev = sw.packed.device
            self._ops = (sw, FlashInferOperands(
                b, sf, in_scale, w_scale, torch.tensor([1.0 / in_scale], dtype=torch.float32, device=dev),
                torch.tensor([in_scale * w_scale], dtype=torch.float32, device=dev)))
        return self._ops[1]


def flashinfer_weight(w: SwizzledWeight) -> tuple[Any, Any, float, float]:
    """(B as a (K/2, N) column-major uint8 view, its 128x4 scales as a (C, R) view, input scale,
    weight global scale): the runner's weight operands, views of the packed weight (no copy)."""
    import torch
    b = w.packed.view(torch.uint8).T
    sf = w.scales.view(torch.uint8).reshape(-1, (w.k // w.block + 3) // 4 * 4).T
    in_scale = float(w.input_scale) if w.input_scale is not None else 1.0
    return b, sf, in_scale, float(w.global_scale)
