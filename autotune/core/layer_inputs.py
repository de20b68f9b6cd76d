"""A MoE layer's inputs and its float64 reference (autotune.core.layer.LayerProblem), under the
names `autotune.core.inputs` gives one GEMM's, so the search's worker draws either the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from autotune.core import inputs
from autotune.core.layer import KIND, LayerProblem, parse_key  # noqa: F401  (the worker reads keys here)
from autotune.core.measure import ROUTING_SKEW


@dataclass
class LayerInputs:
    """One input set of a layer: x [M, H], both stacked FP4 weights, the routing."""
    x: torch.Tensor
    w13: Any
    w2: Any
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor

    def args(self) -> tuple:
        return (self.x, self.w13, self.w2, self.topk_ids, self.topk_weights)

    def nbytes(self) -> int:
        t = [self.x, self.w13.packed, self.w13.scales, self.w2.packed, self.w2.scales, self.topk_ids, self.topk_weights]
        return sum(a.numel() * a.element_size() for a in t)


def set_bytes(problem: LayerProblem, m: int) -> int:
    """Bytes of one input set without making one (`inputs.set_bytes` of the two GEMMs' weights)."""
    w13, w2 = problem.pair
    weights = sum(p.experts * p.n * (p.k // 2 + p.k // p.block) for p in (w13, w2))
    return m * problem.k * 2 + weights + m * problem.top_k * 8


def make_inputs(problem: LayerProblem, m: int, device: str, seed: int, n_sets: int = 1,
                weights: Sequence[tuple] | None = None, skew: float = ROUTING_SKEW) -> list[LayerInputs]:
    """n_sets input sets; `weights`: (w13, w2) pairs reused instead of drawn (a search draws them
    once per problem)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed + 1)
    sets = []
    for i in range(n_sets):
        x = torch.randn(m, problem.k, generator=gen, device=gen.device).to(torch.bfloat16)
        if weights is not None:
            w13, w2 = weights[i]
        else:
            w13, w2 = (inputs.random_weight(p, device, gen) for p in problem.pair)
        ids, tw = inputs.routing(m, problem.experts, problem.top_k, cpu_gen, skew)
        sets.append(LayerInputs(x, w13, w2, ids.to(device), tw.to(device)))
    return sets


def seeded_weights(problem: LayerProblem, device: str, seed: int) -> tuple:
    """(w13, w2) from their own seed, as `inputs.seeded_weight` draws one GEMM's."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(inputs.random_weight(p, device, gen) for p in problem.pair)


def reference(problem: LayerProblem, s: LayerInputs) -> torch.Tensor:
    """The whole layer in float64, [M, H]: per expert with routed pairs, its float64 dequantized
    w13 and w2, SwiGLU on [gate; up] and the routing weight, summed per token; h never rounded (a
    layer or pair kernel rounds it to bf16: within the check's tolerance). Expert id −1: nothing;
    an id outside [−1, E) is refused."""
    ids = s.topk_ids.long()
    if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= problem.experts):
        raise ValueError(f"{problem.key}: expert ids outside [-1, {problem.experts})")
    x = s.x.double()
    y = torch.zeros(x.shape[0], problem.k, dtype=torch.float64, device=x.device)
    tw = s.topk_weights.double()
    i = problem.inter
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        g = x[rows] @ s.w13.expert(e).dequantize(torch.float64).T            # [pairs, 2I]
        h = torch.nn.functional.silu(g[:, :i]) * g[:, i:]
        y.index_add_(0, rows, (h @ s.w2.expert(e).dequantize(torch.float64).T) * tw[rows, slots, None])
    return y


def out_shape(problem: LayerProblem, m: int) -> tuple[int, int]:
    return (m, problem.k)


def check(problem: LayerProblem, kernel: Callable, s: LayerInputs, ref: torch.Tensor) -> float:
    """One call into a NaN-filled buffer against the float64 reference (`inputs.check`'s rule and
    tolerance); returns the relative error or raises inputs.CheckFailed."""
    return inputs.check(problem, kernel, s, ref)     # duck-typed: out_dtype, args(), x


def empty_out(problem: LayerProblem, m: int, s: LayerInputs) -> torch.Tensor:
    return torch.empty(out_shape(problem, m), dtype=inputs.OUT_DTYPE[problem.out_dtype], device=s.x.device)


#: the names `autotune.core.inputs` gives them, so the search's worker takes a layer's inputs as it
#: takes one GEMM's
seeded_weight = seeded_weights
torch_empty_out = empty_out
