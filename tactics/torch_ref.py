"""The `torch` family: dequantize the FP4 weight, then torch.matmul.

It runs everywhere (the CPU too) and is the designated default wherever Triton cannot run. Its
variants are real trade-offs: the dtype the weight is dequantized to (bf16 halves the bytes,
fp32 is faster on CPUs without bf16 units) and chunking over N (dequantize and multiply one
slab of rows at a time, so the dequantized copy stays small and cache-resident).
Grouped MoE dequantizes only the experts that receive tokens. Every epilogue variant is computed
here (dense and grouped SwiGLU, the grouped reduce), in fp32 after the matmul.

W4A4 problems (a_fmt == w_fmt) are EMULATED: the activations are quantized by the reference
quantizer (autotune.core.inputs.quantize_activations: NVFP4 under the weight's static
input_scale, per expert for stacked experts), dequantized and multiplied like the weight. It is
numerically the W4A4 problem, at bf16/fp32 matmul speed; `w4a4_emulated` says so, so nothing
counts it as a W4A4 kernel of the arch.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from autotune.core.codekey import Code
from autotune.core.arch import Arch
from autotune.core.operands import check_out, check_weight, out_shape, x_checker
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import FamilyBase, FunctionKernel

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CHUNKS = (0, 512, 2048)
_SCHEMA = {"dequant_dtype": tuple(DTYPES), "chunk_n": CHUNKS}
OUT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _rows(w, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
    """Dequantize weight rows [n0, n1) of a 2-D FP4Weight."""
    from autotune.core.formats import FP4Weight
    part = FP4Weight(w.packed[n0:n1], w.scales[n0:n1], w.global_scale, w.fmt)
    return part.dequantize(dtype)


def _act(problem, x: torch.Tensor, w, dtype: torch.dtype) -> torch.Tensor:
    """x as the problem multiplies it: as is (bf16 activations), or FP4-quantized and dequantized (W4A4)."""
    if problem.a_fmt == "bf16":
        return x
    from autotune.core.inputs import quantize_activations
    return quantize_activations(problem, x, w).dequantize(dtype)


def _dense(x: torch.Tensor, w, dtype: torch.dtype, chunk: int, out: torch.Tensor) -> torch.Tensor:
    xd = x.to(dtype)
    n = w.packed.shape[-2]
    step = chunk or n
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        out[:, n0:n1] = (xd @ _rows(w, n0, n1, dtype).T).to(out.dtype)
    return out


def _slab(x: torch.Tensor, part, dtype: torch.dtype, dst: torch.Tensor) -> None:
    """dst = x · dequant(part)ᵀ: the whole GPU/CPU work of a bound call (a no-op in the CPU bench)."""
    w = part.dequantize(dtype)
    if dst.dtype == dtype and dst.is_contiguous():
        torch.matmul(x, w.T, out=dst)
    else:
        dst.copy_(x @ w.T)


def _swiglu_into(y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = silu(gate) · up of y's vLLM [gate; up] columns, in fp32 (the dense swiglu variant)."""
    h = y.shape[-1] // 2
    g, u = y[..., :h].float(), y[..., h:].float()
    out.copy_(torch.nn.functional.silu(g) * u)
    return out


def bind_dense(problem, tactic: Tactic, packed, batch_invariant: bool = False) -> FunctionKernel:
    """launch(x, out=None) for one dense weight: the dtypes and the weight's row slabs (views, one
    per chunk) made once here; a call checks x, allocates y (not with out=) and runs the slabs."""
    from autotune.core.formats import FP4Weight
    check_weight(problem, packed)
    dtype, chunk, odt, n = DTYPES[tactic["dequant_dtype"]], int(tactic["chunk_n"]), OUT[problem.out_dtype], problem.n
    step = chunk or n
    slabs = tuple((n0, min(n, n0 + step), FP4Weight(packed.packed[n0:n0 + step], packed.scales[n0:n0 + step],
                                                     packed.global_scale, packed.fmt)) for n0 in range(0, n, step))
    whole = slabs[0][2] if len(slabs) == 1 else None
    check = x_checker(problem, packed)
    w4a4 = problem.a_fmt != "bf16"
    swiglu = problem.epilogue == "swiglu"

    def launch(x, out=None):
        check(x)
        if out is None:
            out = x.new_empty((x.shape[0], problem.out_n), dtype=odt)
        else:
            check_out(problem, x, out)
        xd = x if x.dtype is dtype else x.to(dtype)
        if w4a4:
            xd = _act(problem, x, packed, dtype)
        y = x.new_empty((x.shape[0], n), dtype=dtype) if swiglu else out     # [gate; up] before the epilogue
        if whole is not None:
            _slab(xd, whole, dtype, y)
        else:
            for n0, n1, part in slabs:
                _slab(xd, part, dtype, y[:, n0:n1])
        return _swiglu_into(y, out) if swiglu else out
    return FunctionKernel(launch, weight=packed, batch_invariant=batch_invariant)


class TorchFamily(FamilyBase):
    name = "torch"
    #: the sources its measured numbers depend on: kernel, launch and pack code (autotune.core.codekey)
    CODE = Code.of("torch", __package__, ".torch_ref", ".base",
                   "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats", "autotune.core.inputs", "autotune.core.jsonread", "autotune.core.operands", "autotune.core.problem", "autotune.core.tactic")
    depends_on = ("torch",)
    default_rank = 1      # the default wherever Triton cannot run (the CPU)
    w4a4_emulated = True  # its W4A4 tactics quantize activations in torch: no W4A4 kernel of the arch
    dense_epilogues = ("none", "swiglu")

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def supports(self, problem) -> str | None:
        if problem.w_fmt not in ("nvfp4", "mxfp4"):
            return f"torch family covers FP4 weights, not {problem.w_fmt}"
        if problem.a_fmt not in ("bf16", problem.w_fmt):
            return f"torch family takes bf16 activations or (emulated W4A4) the weight's format, not {problem.a_fmt}"
        return None

    def enumerate(self, problem, arch: Arch) -> Iterable[Tactic]:
        if self.supports(problem):
            return []
        return [Tactic(self.name, dequant_dtype=d, chunk_n=c) for d in DTYPES for c in CHUNKS]

    def validate(self, tactic: Tactic) -> str | None:
        return check_params(tactic, _SCHEMA, "torch")

    def verdict_checked(self, problem, tactic: Tactic, arch: Arch) -> Verdict:
        if tactic["chunk_n"] and tactic["chunk_n"] >= problem.n:
            return Verdict.reject(f"chunk_n {tactic['chunk_n']} >= N {problem.n}: same as no chunking")
        return Verdict.keep()

    def default(self, problem, arch: Arch) -> Tactic:
        return Tactic(self.name, dequant_dtype="bf16" if arch.is_gpu else "fp32", chunk_n=0)

    def first_batch_member(self, problem) -> bool:
        """Not for grouped MoE: there it is a host loop over the routed experts (a chain of launches
        per expert and a host read), 100-400x the grouped kernels on the H100 (166 ms against 401 us,
        GLM-5's w2 at M = 1024), 117 s of the GPU time of the H100 main job of 2026-12-05 and every failed capture
        it leaked; the trees predicted it at most 2^2.98x the top. Dense: dequantize + cuBLAS, a
        real candidate at prefill sizes."""
        return problem.kind != "grouped_moe"

    def bind(self, problem, tactic: Tactic, packed, device: str):
        if problem.kind == "dense":
            return bind_dense(problem, tactic, packed, self.batch_invariant(problem, tactic))
        return super().bind(problem, tactic, packed, device)

    def build(self, problem, tactic: Tactic, device: str):
        dtype, chunk, odt = DTYPES[tactic["dequant_dtype"]], int(tactic["chunk_n"]), OUT[problem.out_dtype]

        if problem.kind == "dense":
            def kernel(x, w, out=None):
                if out is None:
                    out = torch.empty(x.shape[0], problem.out_n, dtype=odt, device=x.device)
                if problem.epilogue == "swiglu":       # [gate; up] in fp32, then silu(gate) · up
                    y = torch.empty(x.shape[0], problem.n, dtype=torch.float32, device=x.device)
                    return _swiglu_into(_dense(_act(problem, x, w, dtype), w, dtype, chunk, y), out)
                return _dense(_act(problem, x, w, dtype), w, dtype, chunk, out)
            return FunctionKernel(kernel)

        def moe_kernel(x, w, topk_ids, topk_weights=None, out=None):
            m, top_k = topk_ids.shape
            if out is None:
                out = torch.empty(out_shape(problem, m), dtype=odt, device=x.device)
            # fp32 rows per (token, slot), then the epilogue (swiglu / routing weights / reduce)
            y = torch.zeros(m, top_k, problem.n, dtype=torch.float32, device=x.device)
            flat = topk_ids.reshape(-1)
            order = torch.argsort(flat, stable=True)
            experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
            start = 0
            for e, c in zip(experts.tolist(), counts.tolist()):
                pairs = order[start:start + c]
                start += c
                if e < 0:                       # -1: expert not on this rank, a zero row and no work
                    continue
                if e >= problem.experts:
                    raise ValueError(f"{problem.key}: expert id {e} outside [-1, {problem.experts})")
                rows, slots = pairs // top_k, pairs % top_k
                xe = x[rows, slots] if x.ndim == 3 else x[rows]
                we = w.expert(e)
                ye = torch.empty(c, problem.n, dtype=odt, device=x.device)
                y[rows, slots] = _dense(_act(problem, xe, we, dtype), we, dtype, chunk, ye).float()
            if problem.epilogue == "swiglu":
                y = torch.nn.functional.silu(y[..., :problem.n // 2]) * y[..., problem.n // 2:]
            if topk_weights is not None:
                y = y * topk_weights.float()[..., None]
            out.copy_(y.sum(1) if problem.epilogue == "reduce" else y)
            return out
        return FunctionKernel(moe_kernel)
