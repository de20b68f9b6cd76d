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
w4a4_kernels.py.
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping

from autotune.core.tactic import Tactic, Verdict

from . import compat as _compat
from . import smem as _smem
from .args import fp32_scale, note_compiled

FAMILY = "triton"
KERNEL = "w4a4_dot_scaled"
PARAMS = ("block_k", "block_m", "block_n", "kernel", "num_stages", "num_warps")
BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (128, 256)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)
GROUP_M = 8
#: activation-quantization tile (fixed): 32 rows × 128 columns per program
QUANT_BLOCK_M = 32
QUANT_BLOCK_K = 128
#: what a call of the launcher times (the bench reports it beside the result)
INCLUDES_ACTIVATION_QUANT = True



def supported(problem: Any) -> str | None:
    """None when `problem` is a W4A4 problem this member runs, else why not."""
    if getattr(problem, "kind", None) != "dense":
        return f"triton w4a4 kernel handles dense problems, not {getattr(problem, 'kind', None)!r}"
    if problem.w_fmt not in ("nvfp4", "mxfp4") or problem.a_fmt != problem.w_fmt:
        return (f"triton w4a4 kernel needs FP4 activations in the weight's format (nvfp4*nvfp4 or "
                f"mxfp4*mxfp4), not {problem.a_fmt}*{problem.w_fmt}")
    if problem.out_dtype != "bf16":
        return f"triton w4a4 kernel writes bf16, not {problem.out_dtype}"
    return None


def is_w4a4(problem: Any) -> bool:
    return getattr(problem, "a_fmt", "bf16") in ("nvfp4", "mxfp4")


def _silly(bm: int, bn: int, bk: int, warps: int) -> bool:
    if warps == 8 and bm * bn < 64 * 128:        # idle warps on a small tile
        return True
    if warps == 4 and bm * bn >= 128 * 256:      # 128x256 fp32 accumulator on 128 threads: spills
        return True
    return False


def enumerate_space(problem: Any, arch: Any) -> list[Tactic]:
    if supported(problem) is not None:
        return []
    return [Tactic(FAMILY, kernel=KERNEL, block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in itertools.product(BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES)
            if not _silly(bm, bn, bk, w)]


def default(problem: Any, arch: Any) -> Tactic:
    k = getattr(problem, "k", 128)
    bk = 256 if k % 256 == 0 else 128
    return Tactic(FAMILY, kernel=KERNEL, block_m=64, block_n=128, block_k=bk, num_warps=4, num_stages=3)


def validate(params: Mapping[str, Any]) -> str | None:
    if tuple(sorted(params)) != PARAMS:
        return f"triton {KERNEL} tactic needs exactly the parameters {PARAMS}, got {tuple(sorted(params))}"
    for k in PARAMS:
        v = params[k]
        if k != "kernel" and (not isinstance(v, int) or isinstance(v, bool)):
            return f"{k} must be an int, got {v!r}"
    # the domain the smem model was fitted on (every point of it cross-compiled, Triton 3.9)
    for k, ok in (("block_m", BLOCK_M), ("block_n", BLOCK_N), ("block_k", BLOCK_K), ("num_warps", NUM_WARPS),
                  ("num_stages", NUM_STAGES)):
        if params[k] not in ok:
            return f"{k} must be one of {ok} for {KERNEL} (the smem model's fitted range), got {params[k]}"
    return None


def verdict(problem: Any, tactic: Tactic, arch: Any) -> Verdict:
    p = tactic.params
    why = validate(p) or supported(problem)
    if why:
        return Verdict.reject(why)
    stages = p["num_stages"]
    bk = p["block_k"]
    if _silly(p["block_m"], p["block_n"], bk, p["num_warps"]):
        return Verdict.reject("config pruned from the space (idle warps or accumulator spills); the smem model "
                              "is not checked there", stages=stages)
    if problem.k % bk:
        return Verdict.reject(f"BLOCK_K={bk} does not divide K={problem.k} (the kernel does not mask K)",
                              stages=stages)
    if problem.n % 16:
        return Verdict.reject(f"N={problem.n} is not a multiple of 16 (the kernel is specialized for it)",
                              stages=stages)
    if not getattr(arch, "is_gpu", True):
        return Verdict.keep(stages=stages)      # cpu pseudo-arch: interpreter, no smem limit
    if arch.cc[0] < 8:
        return Verdict.reject(f"{arch.name}: tl.dot_scaled needs sm80 or newer", stages=stages)
    if problem.w_fmt == "nvfp4" and arch.cc < (8, 9):
        # Triton 3.9.0, cross-compiled for sm80: the e4m3 scale pointer does not lower
        return Verdict.reject(f"{arch.name}: NVFP4 e4m3 scales need sm89 or newer "
                              "(Triton: type fp8e4nv not supported in this architecture)", stages=stages)
    why = _compat.rejection("dot_scaled", problem.w_fmt, arch)
    if why:
        return Verdict.reject(why, stages=stages)
    need = _smem.w4a4_smem_bytes(p, problem.w_fmt, arch)
    limit = arch.smem_per_block_optin
    if need > limit:
        return Verdict.reject(f"smem {need} > {limit}", smem=need, limit=limit, stages=stages)
    cols = _smem.w4a4_tmem_columns(p, problem.w_fmt, arch)
    if cols > 512:
        return Verdict.reject(f"tmem {cols} columns > 512", smem=need, limit=limit, stages=stages)
    return Verdict.keep(need, limit, stages)


# ---- compiling without a GPU ---------------------------------------------------------------------

def _gemm_source(fmt: str, params: Mapping[str, Any]):
    from triton.compiler import ASTSource

    from . import w4a4_kernels as K
    consts = {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]),
              "BLOCK_K": int(params["block_k"]), "GROUP_M": GROUP_M, "SCALE_GROUP": 16 if fmt == "nvfp4" else 32}
    types = K.gemm_arg_types(fmt)
    sig = {n: types[n] for n in K.GEMM_ARG_NAMES}
    sig.update({c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in K.GEMM_DIVISIBLE}
    src = ASTSource(K.w4a4_gemm_kernel, sig, constexprs=consts, attrs=attrs)
    return src, {"num_warps": int(params["num_warps"]), "num_stages": int(params["num_stages"])}


def _quant_source(fmt: str):
    from triton.compiler import ASTSource

    from . import w4a4_kernels as K
    consts = {"BLOCK_M": QUANT_BLOCK_M, "BLOCK_K": QUANT_BLOCK_K, "SCALE_GROUP": 16 if fmt == "nvfp4" else 32,
              "SCALE_E4M3": 1 if fmt == "nvfp4" else 0}
    sig = {n: K.QUANT_ARG_TYPES[n] for n in K.QUANT_ARG_NAMES}
    sig.update({c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in K.QUANT_DIVISIBLE}
    return ASTSource(K.act_quant_kernel, sig, constexprs=consts, attrs=attrs), {"num_warps": 4, "num_stages": 1}


def cross_compile(fmt: str, params: Mapping[str, Any] | None, arch_or_cc: Any, stop_at: str = "llir",
                  cache_dir: str | None = None):
    """Compile the GEMM (params given) or the activation quantizer (params None) for a CUDA target
    without a GPU, with the launcher's specialization. Returns the CompiledKernel (at "llir" its
    cubin is an empty stub; `metadata.shared` and `metadata.tmem_size` are set)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from .compile import _LOCK, _cache_dir, _cc_of, _stop_after_llir
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"format must be nvfp4 or mxfp4, got {fmt!r}")
    if stop_at not in ("llir", "cubin"):
        raise ValueError(f"stop_at must be 'llir' or 'cubin', got {stop_at!r}")
    src, options = _gemm_source(fmt, params) if params is not None else _quant_source(fmt)
    target = GPUTarget("cuda", _cc_of(arch_or_cc), 32)
    with _LOCK, _cache_dir(cache_dir):
        if stop_at == "llir":
            with _stop_after_llir(src.fn.__name__):
                return triton.compile(src, target=target, options=options)
        return triton.compile(src, target=target, options=options)


# ---- launcher ---------------------------------------------------------------------------------------

class W4A4Launcher:
    """kernel(x, w, out=None) -> y: quantize x (bf16 [M, K]) with our Triton kernel, then the
    dot_scaled GEMM. `w` is an FP4Weight in the problem's format; NVFP4 quantizes under
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
        ws = w.scales.contiguous()
        if self.fmt == "mxfp4" and ws.dtype != torch.uint8:
            ws = ws.view(torch.uint8)
        grid = (triton.cdiv(m, p["block_m"]) * triton.cdiv(n, p["block_n"]),)
        ck = w4a4_gemm_kernel[grid](xq, xs, w.packed.contiguous(), ws, self._input_scale(w, xq.device),
                                    fp32_scale(w.global_scale, xq.device), out, m, n, prob.k,
                                    BLOCK_M=p["block_m"], BLOCK_N=p["block_n"], BLOCK_K=p["block_k"],
                                    GROUP_M=GROUP_M, SCALE_GROUP=self.group,
                                    num_warps=p["num_warps"], num_stages=p["num_stages"])
        note_compiled(self, ck, xq.device, lambda arch: _smem.w4a4_smem_bytes(p, self.fmt, arch))
        return out

    def __call__(self, x, w, out=None):
        q, s = self.quantize(x, w)
        return self.gemm(q, s, w, out)


# ---- inputs and reference for W4A4 problems (autotune/core/inputs.py serves W4A16 only) ----------------

def make_inputs(problem: Any, m: int, device: str, seed: int, n_sets: int = 1):
    """inputs.make_inputs for a W4A4 problem (it adds the activation global scale a checkpoint
    would carry: NVFP4 amax(x) / (6 · 448), ModelOpt's calibration; MXFP4 none)."""
    from autotune.core import inputs
    why = supported(problem)
    if why:
        raise ValueError(why)
    return inputs.make_inputs(problem, m, device, seed, n_sets)


def input_scale_of(w):
    """The NVFP4 activation global scale of a weight: its input_scale, or 1.0 (see W4A4Launcher)."""
    import torch
    if w.input_scale is None:
        return torch.ones((), dtype=torch.float32, device=w.packed.device)
    return w.input_scale


def quantized_activations(problem: Any, x, w):
    """What the W4A4 kernel multiplies: x quantized by the torch reference (inputs.quantize_activations)."""
    from autotune.core import inputs
    return inputs.quantize_activations(problem, x, w)


def reference(problem: Any, s) -> Any:
    """float64 reference of a W4A4 problem: dequant(quant(x)) · dequant(W)ᵀ (inputs.reference)."""
    from autotune.core import inputs
    return inputs.reference(problem, s)


# ---- full-space check of the smem/tmem model against the compiler -------------------------------

def _sweep_one(args):
    fmt, cc, params, cache_dir = args
    from autotune.core.arch import arch_for_cc
    arch = arch_for_cc(cc // 10, cc % 10)
    try:
        ck = cross_compile(fmt, params, cc, cache_dir=cache_dir)
    except Exception as e:          # a compile failure is a row of the table, not a crash
        return fmt, cc, params, None, None, f"{type(e).__name__}: {str(e).splitlines()[-1][:160]}"
    got = (int(ck.metadata.shared), int(getattr(ck.metadata, "tmem_size", 0) or 0))
    want = (_smem.w4a4_smem_bytes(params, fmt, arch), _smem.w4a4_tmem_columns(params, fmt, arch))
    return fmt, cc, params, got, want, None


def sweep(targets=(89, 90, 100, 120, 121), fmts=("nvfp4", "mxfp4"), processes: int = 1) -> list[tuple]:
    """Cross-compile the whole default space for each (format, target) and return one row per
    config: (fmt, cc, params, (shared, tmem) compiled, (shared, tmem) modelled, error)."""
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    from autotune.core.problem import Problem
    cache = tempfile.mkdtemp(prefix="w4a4-sweep-")
    jobs = [(fmt, cc, {k: v for k, v in t.params.items()}, cache) for fmt in fmts for cc in targets
            for t in enumerate_space(Problem.dense(4096, 4096, fmt, a_fmt=fmt), None)]
    if processes <= 1:
        return [_sweep_one(j) for j in jobs]
    import multiprocessing as mp
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_sweep_one, jobs, chunksize=8))


def main(argv: list[str] | None = None) -> int:
    """python3 -m tactics.triton_fp4.w4a4 [--targets 89,90,100,120,121] [--processes N]: the
    model-vs-compiler table for the whole space (markdown), exit 1 on any difference."""
    import argparse
    import sys
    import time
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--targets", default="89,90,100,120,121")
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--processes", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.time()
    rows = sweep(tuple(int(c) for c in a.targets.split(",")), tuple(a.formats.split(",")), a.processes)
    import triton
    print(f"W4A4 smem/tmem model vs Triton {triton.__version__} (cross-compiled to LLVM IR, "
          f"{len(rows)} compiles, {time.time() - t0:.0f} s)\n")
    print("| format | target | configs | failed to compile | smem differences | tmem differences |")
    print("|---|---|---:|---:|---:|---:|")
    bad = 0
    for fmt in a.formats.split(","):
        for cc in a.targets.split(","):
            rs = [r for r in rows if r[0] == fmt and r[1] == int(cc)]
            err = [r for r in rs if r[5]]
            ds = [r for r in rs if not r[5] and r[3][0] != r[4][0]]
            dt = [r for r in rs if not r[5] and r[3][1] != r[4][1]]
            bad += len(ds) + len(dt)
            print(f"| {fmt} | sm{cc} | {len(rs)} | {len(err)} | {len(ds)} | {len(dt)} |")
    for r in rows:
        if r[5] or r[3] != r[4]:
            print("  ", r[0], f"sm{r[1]}", r[2], "compiled", r[3], "model", r[4], r[5] or "", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
