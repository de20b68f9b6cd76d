"""Problem inputs, the float64 reference and the output check — shared by the search and by families.

Inputs are random, never zeros; a search draws the weights once per problem (`seeded_weight`)
and the activations per (problem, bucket). The check runs a kernel once into a NaN-filled buffer
and compares it with a float64 dequantize-then-matmul reference (activations quantized first
for a W4A4 problem, so the quantization error is the problem's, not the kernel's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from autotune.core.formats import FP4Weight, quantize, quantize_activation_nvfp4
from autotune.core.measure import ROUTING_SKEW
from autotune.core.operands import out_shape
from autotune.core.problem import Problem

#: relative Frobenius error allowed against the float64 reference, per output dtype
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 1e-4}
OUT_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class CheckFailed(Exception):
    """A tactic computed the wrong thing (or left outputs unwritten)."""


@dataclass
class InputSet:
    x: torch.Tensor
    w: FP4Weight
    topk_ids: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None

    def args(self) -> tuple:
        if self.topk_ids is None:
            return (self.x, self.w)
        return (self.x, self.w, self.topk_ids, self.topk_weights)

    def nbytes(self) -> int:
        t = [self.x, self.w.packed, self.w.scales]
        if self.topk_ids is not None:
            t += [self.topk_ids, self.topk_weights]
        return sum(a.numel() * a.element_size() for a in t)


def _generator(device: str, seed: int) -> torch.Generator:
    # drawn where the data lives: generating a 400 MB MoE weight on the CPU and copying it costs seconds
    return torch.Generator(device=device).manual_seed(seed)


def random_weight(problem: Problem, device: str, gen: torch.Generator):
    """A random FP4 weight: uniform codes, scales spread over a few octaves, never zeros."""
    lead = (problem.experts,) if problem.kind == "grouped_moe" else ()
    packed = torch.randint(0, 256, lead + (problem.n, problem.k // 2), dtype=torch.uint8, generator=gen,
                           device=gen.device)
    sshape = lead + (problem.n, problem.k // problem.block)
    if problem.w_fmt == "nvfp4":
        scales = (2.0 ** (torch.rand(sshape, generator=gen, device=gen.device) * 4 - 2)).to(torch.float8_e4m3fn)
        # stacked experts carry one scale each, as a ModelOpt checkpoint does (and as the MoE
        # kernels are compiled ahead for)
        gscale = torch.full(lead, 1.0 / 64, dtype=torch.float32)
    else:
        scales = torch.randint(122, 127, sshape, dtype=torch.uint8, generator=gen, device=gen.device)
        gscale = torch.tensor(1.0, dtype=torch.float32)
    return FP4Weight(packed.to(device), scales.to(device), gscale.to(device), problem.w_fmt)


def seeded_weight(problem: Problem, device: str, seed: int):
    """random_weight from its own seed: a search draws a problem's weights once, one seed per
    input set, and reuses them for every bucket (a layer's weights do not depend on the batch)."""
    return random_weight(problem, device, _generator(device, seed))


def routing(m: int, experts: int, top_k: int, gen: torch.Generator, skew: float = ROUTING_SKEW):
    """Top-k distinct expert ids per token, expert popularity Zipf-like with exponent `skew` (the
    search's draw by default: uniform, measure.py says why). CPU generator."""
    pop = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** skew
    pop = pop[torch.randperm(experts, generator=gen)]
    ids = torch.multinomial(pop.expand(m, experts), top_k, replacement=False, generator=gen)
    w = torch.rand(m, top_k, generator=gen, dtype=torch.float32) + 0.1
    return ids.to(torch.int32), (w / w.sum(1, keepdim=True))


def set_bytes(problem: Problem, m: int) -> int:
    """Bytes of one input set (activation, FP4 weight, scales, routing): InputSet.nbytes() without
    making one, to size the cold-L2 rotation first."""
    e = problem.experts if problem.kind == "grouped_moe" else 1
    route = m * problem.top_k * 8 if problem.kind == "grouped_moe" else 0
    rows = m * problem.top_k if problem.epilogue == "reduce" else m
    return rows * problem.k * 2 + e * problem.n * (problem.k // 2 + problem.k // problem.block) + route


def make_inputs(problem: Problem, m: int, device: str, seed: int, n_sets: int = 1,
                weights: Sequence | None = None, skew: float = ROUTING_SKEW) -> list[InputSet]:
    """n_sets input sets; `weights` (at least n_sets of them) are reused instead of drawn; `skew`:
    the routing draw's Zipf exponent (the search's: uniform; tests ask for hot experts)."""
    # routing comes from its own CPU stream (offset seed: on the CPU the two would otherwise coincide)
    gen, cpu_gen = _generator(device, seed), torch.Generator().manual_seed(seed + 1)
    sets = []
    for i in range(n_sets):
        lead = (m, problem.top_k) if problem.epilogue == "reduce" else (m,)     # w2 reads one row per pair
        x = torch.randn(*lead, problem.k, generator=gen, device=gen.device).to(torch.bfloat16)
        w = weights[i] if weights is not None else random_weight(problem, device, gen)
        if problem.kind == "grouped_moe":
            ids, tw = routing(m, problem.experts, problem.top_k, cpu_gen, skew)
            sets.append(InputSet(x, w, ids.to(device), tw.to(device)))
        else:
            sets.append(InputSet(x, w))
    if problem.a_fmt == "nvfp4":
        # W4A4: the static activation scale a ModelOpt checkpoint carries, amax / (6 · 448)
        for st in sets:
            amax = st.x.float().abs().amax() if st.x.numel() else torch.zeros((), device=st.x.device)
            isc = torch.where(amax > 0, amax / (6.0 * 448.0), torch.ones_like(amax)).float().reshape(())
            st.w = FP4Weight(st.w.packed, st.w.scales, st.w.global_scale, st.w.fmt, isc)
    return sets


def quantize_activations(problem: Problem, x: torch.Tensor, w):
    """x quantized to the problem's FP4 activation format by the torch reference (autotune.core.formats),
    as an FP4Weight: NVFP4 under the weight's input_scale (1.0 when it has none), MXFP4 as is."""
    if problem.a_fmt == "nvfp4":
        isc = w.input_scale if w.input_scale is not None else torch.ones((), device=x.device)
        isc = isc.float().reshape(()).to(x.device)
        q, sc = quantize_activation_nvfp4(x, isc)
        return FP4Weight(q, sc, isc, "nvfp4")
    return quantize(x, problem.a_fmt)


def activations(problem: Problem, s: InputSet) -> torch.Tensor:
    """x as the kernel multiplies it, in float64: as is for bf16 activations, quantized then
    dequantized for a W4A4 problem — the quantization error is the problem's, not the kernel's."""
    if problem.a_fmt == "bf16":
        return s.x.double()
    return quantize_activations(problem, s.x, s.w).dequantize(torch.float64)


def reference(problem: Problem, s: InputSet) -> torch.Tensor:
    """float64 dequantize-then-matmul, on the inputs' device (activations quantized first for W4A4),
    then the problem's epilogue. Grouped MoE: expert id -1 is a zero row (no contribution)."""
    x = activations(problem, s)
    if problem.kind == "dense":
        return dense_reference(problem, x, s.w)
    return moe_reference(problem, x, s.w, s.topk_ids, s.topk_weights)


def dense_reference(problem: Problem, x: torch.Tensor, w) -> torch.Tensor:
    """float64 x · Wᵀ, then the epilogue: SwiGLU on vLLM's [gate; up] rows, silu(gate) · up, [M, N/2]."""
    y = x.double() @ w.dequantize(torch.float64).T
    if problem.epilogue == "swiglu":
        h = problem.n // 2
        y = y[..., :h] * torch.sigmoid(y[..., :h]) * y[..., h:]
    return y


def moe_reference(problem: Problem, x: torch.Tensor, w, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor | None) -> torch.Tensor:
    """float64 grouped MoE of x ([M, K], or [M, top_k, K] per pair) with the problem's epilogue."""
    return moe_references(problem, [(x, topk_ids, topk_weights)], w)[0]


def moe_references(problem: Problem, calls: Sequence[tuple], w) -> list[torch.Tensor]:
    """`moe_reference` of each (x, topk_ids, topk_weights) on one weight, each expert's float64
    dequantization made once for all of them (it, not the few rows' product, is the cost: 3.1 M
    values an expert for GLM-5's w13). Each call's (token, slot) pairs are sorted by expert once
    (`_by_expert`: one device sync per call), so an expert's rows are a slice, not a search."""
    reduce = problem.epilogue == "reduce"
    xs = [x.double() for x, _, _ in calls]
    # reduce: each expert's rows are summed into [M, N] as they come (no [M, top_k, N] float64, top_k
    # times the output's memory: 3.2 GB for GLM-5's w2 at M = 8192)
    ys = [torch.zeros(ids.shape[0], *(() if reduce else (ids.shape[1],)), problem.n, dtype=torch.float64,
                      device=x.device) for x, (_, ids, _) in zip(xs, calls)]
    groups = [_by_expert(ids, problem.experts) for _, ids, _ in calls]
    for e in sorted(set().union(*(g[2] for g in groups))):
        wt = w.expert(e).dequantize(torch.float64).T
        for x, y, (_, _, tw), (rows_all, slots_all, spans) in zip(xs, ys, calls, groups):
            if e not in spans:
                continue
            a, b = spans[e]
            rows, slots = rows_all[a:b], slots_all[a:b]
            ye = (x[rows, slots] if x.ndim == 3 else x[rows]) @ wt
            if not reduce:
                y[rows, slots] = ye
            else:
                y.index_add_(0, rows, ye if tw is None else ye * tw[rows, slots].double()[:, None])
    return [y if reduce else _moe_epilogue(problem, y, tw) for y, (_, _, tw) in zip(ys, calls)]


def _by_expert(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, dict[int, tuple[int, int]]]:
    """ids' (token, slot) pairs sorted by expert, stably (each expert's pairs in row-major order):
    (rows, slots, {expert: (start, end)}) for every expert with a pair; -1 (not on this rank) is left
    out."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    top_k = max(1, ids.shape[1]) if ids.ndim == 2 else 1
    counts = torch.bincount(flat + 1, minlength=experts + 1).tolist()     # [-1, 0, 1, ...]: the one sync
    spans, start = {}, counts[0]
    for e, c in enumerate(counts[1:]):
        if c:
            spans[e] = (start, start + c)
            start += c
    return order // top_k, order % top_k, spans


def _moe_epilogue(problem: Problem, y: torch.Tensor, topk_weights: torch.Tensor | None) -> torch.Tensor:
    if problem.epilogue == "swiglu":
        h = problem.n // 2
        y = y[..., :h] * torch.sigmoid(y[..., :h]) * y[..., h:]
    if topk_weights is not None:
        y = y * topk_weights.double()[..., None]
    return y


def references(problem: Problem, sets: Sequence[InputSet]) -> list[torch.Tensor]:
    """`reference` of each set; grouped-MoE sets that share one weight (the replay check's two
    seeds) dequantize each expert once for all of them."""
    if problem.kind != "grouped_moe" or any(s.w is not sets[0].w for s in sets):
        return [reference(problem, s) for s in sets]
    return moe_references(problem, [(activations(problem, s), s.topk_ids, s.topk_weights) for s in sets],
                          sets[0].w)


def check(problem: Problem, kernel: Callable, s: InputSet, ref: torch.Tensor) -> float:
    """Run once into a NaN-filled buffer; return the relative error or raise CheckFailed."""
    out = torch.full(ref.shape, float("nan"), dtype=OUT_DTYPE[problem.out_dtype], device=s.x.device)
    got = kernel(*s.args(), out=out)
    if got is not None and got is not out:
        out.copy_(got)
    if s.x.is_cuda:
        torch.cuda.synchronize()
    unwritten = int(torch.isnan(out).sum())
    if unwritten:
        raise CheckFailed(f"{unwritten} of {out.numel()} outputs not written (or NaN)")
    diff = (out.double() - ref).norm()
    scale = ref.norm()
    err = float(diff / scale) if scale > 0 else float(diff)
    tol = TOLERANCE[problem.out_dtype]
    if not math.isfinite(err) or err > tol:
        raise CheckFailed(f"relative error {err:.3g} > {tol:g} against the float64 reference")
    return err


def torch_empty_out(problem: Problem, m: int, s: InputSet) -> torch.Tensor:
    """A preallocated output for timing (the check poisons its own buffer)."""
    return torch.empty(out_shape(problem, m), dtype=OUT_DTYPE[problem.out_dtype], device=s.x.device)
