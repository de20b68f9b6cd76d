"""Bytes and FLOPs of one GEMM call: the x axis of the roofline.

The byte count is the minimum traffic of one call: every operand read once, the output written
once. Weights: the packed FP4 values plus one scale byte per block (the global scale is
negligible). A grouped-MoE call reads only the experts its tokens are routed to; the count is the
expectation under the search's routing draw (autotune.core.measure: top_k distinct experts per
token, uniform unless a skew is given), so a point's intensity matches what was timed.
"""
from __future__ import annotations

from functools import lru_cache

from autotune.core.measure import ROUTING_SKEW
from autotune.core.problem import BLOCK, Problem

#: bits per element of each operand format
BITS = {"nvfp4": 4, "mxfp4": 4, "fp8": 8, "bf16": 16, "fp16": 16, "fp32": 32}


def _operand_bytes(fmt: str, elems: int) -> float:
    scales = elems / BLOCK[fmt] if fmt in BLOCK else 0.0  # one byte per block (e4m3 / e8m0)
    return elems * BITS[fmt] / 8 + scales


@lru_cache(maxsize=4096)
def experts_touched(experts: int, top_k: int, m: int, skew: float = ROUTING_SKEW) -> float:
    """Expected distinct experts hit by m tokens (per-token inclusion ~ top_k × popularity, exact
    when uniform; `skew`: the draw's Zipf exponent, the search's by default)."""
    if experts == 1:
        return 1.0
    pop = [1.0 / (i + 1) ** skew for i in range(experts)]
    total = sum(pop)
    out = 0.0
    for p in pop:
        per_token = min(1.0, top_k * p / total)
        out += 1.0 - (1.0 - per_token) ** m
    return min(float(experts), out)


def call_bytes(p: Problem, m: int, skew: float = ROUTING_SKEW) -> float:
    """The fused forms move what their kernel reads and writes: SwiGLU writes N/2 per (token, slot);
    the top_k reduce reads one activation row per (token, slot) and writes one output row per token."""
    w = experts_touched(p.experts, p.top_k, m, skew) * _operand_bytes(p.w_fmt, p.n * p.k)
    x_rows = m * p.top_k if p.epilogue == "reduce" else m
    y_rows = m if p.epilogue == "reduce" else m * p.top_k
    x = _operand_bytes(p.a_fmt, x_rows * p.k)
    y = y_rows * p.out_n * BITS[p.out_dtype] / 8
    return w + x + y


def intensity(p: Problem, m: int, skew: float = ROUTING_SKEW) -> float:
    """FLOPs per byte of minimum traffic."""
    return p.flops(m) / call_bytes(p, m, skew)
