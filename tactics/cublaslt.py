"""The `cublaslt` family: cuBLASLt matmul algorithms through nvmath-python.

A tactic is one cuBLASLt algorithm: its readable configuration (algorithm id, tile, stages,
split-K, reduction scheme, CTA swizzling, custom option, inner shape, cluster shape) *and* the
96-byte `cublasLtMatmulHeuristicResult_t` that nvmath's `Algorithm.as_numpy()` returns (the
64-byte `cublasLtMatmulAlgo_t` is its first member), hex-encoded, together with the cuBLASLt
version that produced it. cuBLAS documents the algorithm struct as serializable "for use with
the same version of the cuBLAS library" only, so `build` refuses a tactic from another version
(and the family keys its trials on the cuBLAS version, so such a cache entry is a miss).

cuBLASLt exposes no shared-memory figure and its algorithm list comes from the library on a
live GPU, so the static verdict is "unknown until cuBLASLt checks it on the device" and the
family enumerates real algorithms only on a GPU of the target arch. Planned elsewhere (a dry
run for another arch, or the CPU), it lists one tactic: the library's own top heuristic choice.

Problems: bf16 x bf16 and fp8 x fp8 (per-tensor scales, CC 8.9+) baselines, which run on the
H200, and NVFP4 x NVFP4 with block scaling (VEC16_UE4M3, CC 10.0+ in the cuBLAS docs; SM12x is
not documented either way, so there the verdict stays unknown). bf16 activations are quantized
to the activation format on the fly. cuBLASLt has no MXFP4 mode.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from autotune.core.codekey import Code
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import FamilyBase, LauncherBase
from autotune.tactics.swizzled import SwizzledCache, SwizzledLayout, SwizzledWeight, check_bound_weight, pack_swizzled

NAME = "cublaslt"
#: readable configuration fields, read from nvmath's Algorithm on the device
CONFIG = ("algo_id", "tile", "stages", "split_k", "reduction_scheme", "cta_swizzling", "custom_option",
          "inner_shape", "cluster_shape")
#: exactly these parameters: a stored algorithm (the readable fields are display values whose
#: types depend on the nvmath version; `algo` and `cublas` are what replays it) ...
SCHEMA = {"algo_id": int, "split_k": int, "cta_swizzling": int, "custom_option": int, "tile": object,
          "stages": object, "reduction_scheme": object, "inner_shape": object, "cluster_shape": object,
          "algo": str, "cublas": str}
#: sizeof(cublasLtMatmulHeuristicResult_t): algo (8 x u64), workspaceSize (u64), state (i32),
#: wavesCount (f32), reserved (4 x i32)
HEURISTIC_BYTES = 96
ALGO_BYTES = 64
#: the placeholder "let cuBLASLt pick": listed when the family cannot ask the library
HEURISTIC = "heuristic"
#: representative token counts whose heuristic lists are merged into the enumeration
ENUM_M = (128, 1024, 8192)
#: nvmath/cuBLASLt NVFP4 block scaling needs M and N multiples of 128 and K of 64
NVFP4_M_MULTIPLE = 128

UNKNOWN = ("unknown until cuBLASLt checks it on the device (it exposes no shared-memory figure; "
           "its algorithms are listed by the library on a GPU)")
_NO_CPU = "no CUDA GPU: cuBLASLt runs on a GPU only"
_NO_NVMATH = "nvmath-python is not installed (pip install 'fp4-autotune[nvmath]')"

#: (activation format, weight format) pairs the family multiplies; bf16 activations are quantized
#: to the weight's format first (W4A4 / W8A8)
PAIRS = {("bf16", "bf16"), ("fp8", "fp8"), ("bf16", "fp8"), ("nvfp4", "nvfp4"), ("bf16", "nvfp4")}


@dataclass(frozen=True)
class HeuristicResult:
    """The decoded 96-byte cublasLtMatmulHeuristicResult_t (no library needed)."""

    algo: bytes
    workspace_size: int
    state: int
    waves_count: float

    @classmethod
    def from_bytes(cls, raw: bytes) -> "HeuristicResult":
        if len(raw) != HEURISTIC_BYTES:
            raise ValueError(f"a cuBLASLt heuristic result is {HEURISTIC_BYTES} bytes, got {len(raw)}")
        ws, state, waves = struct.unpack_from("<Qif", raw, ALGO_BYTES)
        return cls(raw[:ALGO_BYTES], ws, state, waves)


def encode(raw: bytes) -> str:
    HeuristicResult.from_bytes(bytes(raw))          # checks the size
    return bytes(raw).hex()


def decode(hexstr: str) -> bytes:
    try:
        raw = bytes.fromhex(hexstr)
    except ValueError as e:
        raise ValueError(f"cublaslt algo is not hex: {e}") from None
    HeuristicResult.from_bytes(raw)
    return raw


def problem_support(problem: Any) -> str | None:
    """Why cuBLASLt cannot compute this problem at all, or None."""
    if getattr(problem, "kind", None) != "dense":
        return f"cuBLASLt family: dense GEMMs only, not {getattr(problem, 'kind', None)!r}"
    if problem.w_fmt == "nvfp4" and (problem.n % 128 or problem.k % 64):
        return f"cuBLASLt NVFP4 needs N % 128 == 0 and K % 64 == 0, got N={problem.n} K={problem.k}"
    if "mxfp4" in (problem.a_fmt, problem.w_fmt):
        return "cuBLASLt has no MXFP4 scaling mode (VEC32_UE8M0 is for FP8 operands only)"
    if (problem.a_fmt, problem.w_fmt) not in PAIRS:
        return f"cuBLASLt family does not multiply {problem.a_fmt} x {problem.w_fmt}"
    if problem.out_dtype != "bf16":
        return f"cuBLASLt family writes bf16, not {problem.out_dtype}"
    if getattr(problem, "epilogue", "none") != "none":
        return f"cuBLASLt family has no {problem.epilogue} epilogue"
    return None


def arch_support(problem: Any, arch: Any) -> tuple[bool | None, str]:
    """(False, why) where the docs rule it out, (None, why) where only the library can tell."""
    if not getattr(arch, "is_gpu", True):
        return False, _NO_CPU
    if problem.w_fmt == "nvfp4":
        if arch.cc[0] < 10:
            return False, f"{arch.name.upper()}: cuBLASLt NVFP4 block scaling needs compute capability 10.0+"
        if arch.cc[0] >= 12:
            return None, (f"{arch.name}: cuBLAS documents NVFP4 block scaling for CC 10.0+ without saying "
                          f"whether SM12x has kernels; " + UNKNOWN)
    if problem.w_fmt == "fp8" and arch.cc < (8, 9):
        return False, f"{arch.name.upper()}: cuBLASLt FP8 needs compute capability 8.9+"
    return None, UNKNOWN


def cublas_version() -> str:
    """The loaded cuBLASLt's version (cublasLtGetVersion, e.g. '130200')."""
    from nvmath.bindings import cublasLt
    return str(cublasLt.get_version())


def heuristic_tactic() -> Tactic:
    return Tactic(NAME, {**{k: None for k in CONFIG}, "algo": HEURISTIC, "cublas": None})


def tactic_from_algorithm(alg: Any, version: str) -> Tactic:
    """Our tactic for an nvmath `Algorithm` (reads its configuration: needs the library)."""
    def val(v: Any) -> Any:
        return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    cfg = {"algo_id": int(alg.algorithm_id), "tile": val(alg.tile), "stages": val(alg.stages),
           "split_k": int(alg.split_k), "reduction_scheme": val(alg.reduction_scheme),
           "cta_swizzling": int(bool(alg.cta_swizzling)), "custom_option": int(alg.custom_option),
           "inner_shape": val(alg.inner_shape), "cluster_shape": val(alg.cluster_shape)}
    return Tactic(NAME, {**cfg, "algo": encode(alg.as_numpy().tobytes()), "cublas": str(version)})


#: workspace handed to a replayed algorithm: nvmath sizes the workspace from the heuristic
#: result's workspaceSize, which was computed for the M it was enumerated at; 32 MiB is what
#: cuBLAS recommends for Hopper and newer, and more than any split-K reduction here needs
REPLAY_WORKSPACE = 32 << 20


def algorithm_from_tactic(tactic: Tactic, workspace: int = REPLAY_WORKSPACE) -> Any:
    """nvmath `Algorithm` from a stored tactic: the stored bytes, with workspaceSize raised to at
    least `workspace` (the 64-byte algorithm itself is untouched; no library call)."""
    import numpy as np
    from nvmath.bindings import cublasLt
    from nvmath.linalg.advanced import Algorithm
    arr = np.frombuffer(decode(str(tactic["algo"])), dtype=cublasLt.matmul_heuristic_result_dtype).copy()
    arr["workspace_size"] = max(int(arr["workspace_size"][0]), workspace)
    return Algorithm.from_numpy(arr)


# --------------------------------------------------------------------------- operands

_TORCH_FP8 = "float8_e4m3fn"


def _quantize_operands(problem: Any, x: Any, w: Any) -> tuple[Any, Any, dict, dict]:
    """(a [M,K], b [K,N] column-major, nvmath options, quantization_scales) for one call."""
    import torch
    if problem.w_fmt == "bf16":
        wt = w if isinstance(w, torch.Tensor) else w.dequantize(torch.bfloat16)
        return x.to(torch.bfloat16), wt.T, {}, {}
    if problem.w_fmt == "fp8":
        if isinstance(w, torch.Tensor):
            wq, ws = w, 1.0
        else:
            wq, ws = w
        if x.dtype == torch.float8_e4m3fn:
            xq, xs = x, 1.0
        else:   # per-tensor dynamic scale: amax maps to the e4m3 max (448)
            amax = float(x.abs().max().clamp(min=1e-12))
            xs = amax / 448.0
            xq = (x.float() / xs).to(torch.float8_e4m3fn)
        return xq, wq.T, {"result_type": "bf16"}, {"a": xs, "b": float(ws)}
    # NVFP4 x NVFP4 with VEC16_UE4M3 block scales in the 128x4 layout cuBLASLt reads: the
    # weight's come packed (swizzled once at load) with their scalars read once (Nvfp4Weight);
    # only the activation is quantized and its scales swizzled here
    from autotune.core import formats
    ops = w if isinstance(w, Nvfp4Weight) else nvfp4_weight(w)
    xp, xs = formats.quantize_activation_nvfp4(x, ops.in_scale)
    a = xp.view(torch.float4_e2m1fn_x2)
    scales = {"a": formats.swizzle_128x4(xs).view(torch.float8_e4m3fn), "b": ops.b_scales}
    return a, ops.b, {"block_scaling": True, "alpha": ops.alpha}, scales


class Nvfp4Weight(NamedTuple):
    """An NVFP4 weight as cuBLASLt's operands read it, made once per weight object (bind): B as a
    [K, N] column-major fp4 view, its 128x4 scales as e4m3, and the two scalars read to the host
    once (each `float()` of a device tensor is a sync, formerly paid on every call)."""
    sw: Any
    b: Any
    b_scales: Any
    in_scale: float
    alpha: float


def nvfp4_weight(w: Any) -> Nvfp4Weight:
    import torch
    sw = w if isinstance(w, SwizzledWeight) else pack_swizzled(w)
    in_scale = float(sw.input_scale) if sw.input_scale is not None else 1.0
    return Nvfp4Weight(sw, sw.packed.view(torch.float4_e2m1fn_x2).T, sw.scales.view(torch.float8_e4m3fn), in_scale,
                       in_scale * float(sw.global_scale))


def make_matmul(problem: Any, x: Any, w: Any) -> Any:
    """An nvmath stateful Matmul for these operands (not planned yet)."""
    import nvmath
    from nvmath.linalg.advanced import Matmul, MatmulOptions
    a, b, opts, scales = _quantize_operands(problem, x, w)
    alpha = opts.pop("alpha", None)
    if opts.get("result_type") == "bf16":
        opts["result_type"] = nvmath.CudaDataType.CUDA_R_16BF
    if problem.w_fmt == "nvfp4":
        opts["result_type"] = nvmath.CudaDataType.CUDA_R_16BF
    return Matmul(a, b, alpha=alpha, quantization_scales=scales or None,
                  options=MatmulOptions(**opts) if opts else None)


def plan_algorithms(problem: Any, x: Any, w: Any, limit: int = 16) -> list[Any]:
    """cuBLASLt's heuristic list for these operands (fastest first, by its estimate)."""
    from nvmath.linalg.advanced import MatmulPlanPreferences
    with make_matmul(problem, x, w) as mm:
        return list(mm.plan(preferences=MatmulPlanPreferences(limit=limit)))


class CublasLtFamily(SwizzledLayout, FamilyBase):
    name = NAME
    #: the sources its measured numbers depend on: kernel, launch and pack code (autotune.core.codekey)
    CODE = Code.of(NAME, __package__, ".cublaslt", ".base", ".swizzled",
                   "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats", "autotune.core.jsonread", "autotune.core.inputs", "autotune.core.operands", "autotune.core.problem", "autotune.core.tactic")
    depends_on = ("nvmath-python", "cublas")

    def supports(self, problem: Any) -> str | None:
        return problem_support(problem)

    def available(self, device: str) -> tuple[bool, str]:
        if str(device).startswith("cpu"):
            return False, _NO_CPU
        try:
            import nvmath  # noqa: F401
        except ImportError:
            return False, _NO_NVMATH
        try:
            cublas_version()
        except Exception as e:   # the binding loads libcublasLt lazily
            return False, f"cuBLASLt could not be loaded through nvmath-python: {e}"
        return True, ""

    # ---- space --------------------------------------------------------------------------------
    def enumerate(self, problem: Any, arch: Any) -> list[Tactic]:
        if problem_support(problem) or arch_support(problem, arch)[0] is False:
            return []
        if not self._live(arch):
            return [heuristic_tactic()]
        return self.enumerate_live(problem)

    @staticmethod
    def _live(arch: Any) -> bool:
        """True when this process can ask cuBLASLt on a GPU of `arch`."""
        try:
            import torch
            from autotune.core.arch import detect
            return torch.cuda.is_available() and detect().name == arch.name and CublasLtFamily().available("cuda")[0]
        except Exception:
            return False

    def enumerate_live(self, problem: Any, ms: tuple[int, ...] = ENUM_M, limit: int = 16) -> list[Tactic]:
        """Union of cuBLASLt's heuristic lists at a few M, one tactic per distinct configuration."""
        import torch
        version = cublas_version()
        seen: dict[tuple, Tactic] = {}
        for m in ms:
            x, w = operands(problem, m, "cuda", seed=0)
            for alg in plan_algorithms(problem, x, w, limit):
                t = tactic_from_algorithm(alg, version)
                key = tuple(t[k] for k in CONFIG)
                seen.setdefault(key, t)
            del x, w
        torch.cuda.synchronize()
        return list(seen.values())

    def validate(self, tactic: Tactic) -> str | None:
        if tactic.family != NAME:
            return f"family is {tactic.family!r}, not {NAME!r}"
        if tactic.get("algo") == HEURISTIC:
            why = check_params(tactic, {**{k: (None,) for k in CONFIG + ("cublas",)}, "algo": (HEURISTIC,)},
                               "cublaslt heuristic")
            if why and "exactly the parameters" not in why:
                return f"the heuristic placeholder carries no configuration: {why}"
            return why
        why = check_params(tactic, SCHEMA, "cublaslt")
        if why:
            return why
        try:
            decode(str(tactic["algo"]))
        except ValueError as e:
            return str(e)
        if not tactic["cublas"]:
            return "cublas must name the cuBLASLt version the algorithm came from"
        return None

    # ---- static judgement ---------------------------------------------------------------------
    def verdict_checked(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        ok, why = arch_support(problem, arch)
        return Verdict.reject(why) if ok is False else Verdict(None, why)

    def default(self, problem: Any, arch: Any) -> Tactic:
        return heuristic_tactic()

    # ---- build --------------------------------------------------------------------------------
    def build(self, problem: Any, tactic: Tactic, device: str) -> Any:
        why = self.validate(tactic) or problem_support(problem)
        if why:
            raise ValueError(why)
        ok, why = self.available(device)
        if not ok:
            raise RuntimeError(why)
        if tactic["algo"] != HEURISTIC and tactic["cublas"] != cublas_version():
            raise RuntimeError(f"cuBLASLt algorithm from version {tactic['cublas']} cannot be replayed under "
                               f"{cublas_version()} (the struct is only valid for the same cuBLAS version)")
        return Launcher(problem, tactic)


class Launcher(LauncherBase):
    """kernel(x, w, out=None): one planned nvmath Matmul per M, replaying the tactic's algorithm."""

    def __init__(self, problem: Any, tactic: Tactic):
        self.problem, self.tactic = problem, tactic
        self._mm: dict[tuple[int, Any], Any] = {}
        self._swizzled = SwizzledCache()
        self._checked: Any = None

    def release(self) -> None:
        """The planned Matmuls (each holds its cuBLASLt workspace) and the swizzled weights."""
        mms, self._mm = list(self._mm.values()), {}
        for mm in mms:
            free = getattr(mm, "free", None)          # nvmath's Matmul.free(): its workspace and handles
            if free is not None:
                free()
        self._swizzled = SwizzledCache()
        self._checked = None

    def weight(self, w: Any) -> Any:
        """The weight as the operands read it: for NVFP4 an `Nvfp4Weight` (the swizzled-128x4
        layout, a packed one passing through, plus its scalars), made and checked once per weight
        object, never per call."""
        if self.problem.w_fmt != "nvfp4":
            return w
        sw = self._swizzled(w)
        if self._checked is None or self._checked.sw is not sw:
            check_bound_weight(self.problem, sw, NAME)
            self._checked = nvfp4_weight(sw)
        return self._checked

    def _matmul(self, x: Any, w: Any) -> Any:
        # alpha (the NVFP4 weight's global scale times the activation's) is fixed when the Matmul is
        # made, and reset_operands leaves it: one Matmul per (M, alpha), so a second weight of the
        # problem (another layer, unbound dispatch) is never scaled by the first one's alpha
        key = (x.shape[0], getattr(w, "alpha", None))
        m = key[0]
        mm = self._mm.get(key)
        if mm is None:
            mm = make_matmul(self.problem, x, w)
            try:
                if self.tactic["algo"] == HEURISTIC:
                    mm.plan()
                else:
                    mm.plan(algorithms=[algorithm_from_tactic(self.tactic)])
            except Exception as e:     # nvmath raises cuBLASLtError for an unsupported algorithm
                raise RuntimeError(f"cuBLASLt rejects algorithm {self.tactic['algo_id']} "
                                   f"(tile {self.tactic['tile']}) for M={m}: {e}") from e
            self._mm[key] = mm
        else:
            a, b, _, scales = _quantize_operands(self.problem, x, w)
            mm.reset_operands(a=a, b=b, quantization_scales=scales or None)
        return mm

    def __call__(self, x: Any, w: Any, out: Any = None) -> Any:
        if x.ndim != 2 or x.shape[1] != self.problem.k:
            raise ValueError(f"cublaslt: activation {tuple(x.shape)} does not match the problem's K={self.problem.k}")
        m = x.shape[0]
        if self.problem.w_fmt == "nvfp4" and m % NVFP4_M_MULTIPLE:
            # cuBLASLt's NVFP4 kernels need M % 128 == 0: pad the activation rows with zeros
            import torch
            x = torch.nn.functional.pad(x, (0, 0, 0, -m % NVFP4_M_MULTIPLE))
        mm = self._matmul(x, self.weight(w))
        try:
            y = mm.execute()[:m]
        except Exception as e:
            raise RuntimeError(f"cuBLASLt algorithm {self.tactic['algo_id']} (tile {self.tactic['tile']}) failed "
                               f"at M={m}: {e}") from e
        if out is not None:
            out.copy_(y)
            return out
        return y


def operands(problem: Any, m: int, device: str, seed: int = 0) -> tuple[Any, Any]:
    """Random (x, w) for a problem: bf16 activations; bf16, (fp8, scale) or FP4Weight weights."""
    import torch
    from autotune.core.inputs import make_inputs
    g = torch.Generator().manual_seed(seed)
    if problem.w_fmt in ("nvfp4", "mxfp4"):
        s = make_inputs(problem, m, device, seed)[0]
        return s.x, s.w
    x = torch.randn(m, problem.k, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(problem.n, problem.k, generator=g) / problem.k ** 0.5).to(device)
    if problem.w_fmt == "bf16":
        return x, w.to(torch.bfloat16)
    scale = float(w.abs().max()) / 448.0
    return x, ((w / scale).to(torch.float8_e4m3fn), scale)
