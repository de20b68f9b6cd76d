"""LayerProblem: both GEMMs of one routed MoE layer as one problem, its inputs and float64 reference.

A layer takes x [M, H] bf16 and the router's top_k ids and weights per token and computes
    y[i] = Σ_j weight[i, j] · W2[e] · swiglu(W13[e] · x[i]),   e = ids[i, j] (−1: nothing),
the w13 GEMM (N = 2I vLLM [gate; up] rows, K = H, the SwiGLU epilogue) followed by the w2 GEMM
(N = H, K = I, the top_k reduce). Its two pair problems are the grouped-MoE problems of those GEMMs
(`w13`, `w2`): what FP4MoE runs as two launches; a layer tactic runs both as one call.

The value has the columns of a Problem (kind "moe_layer", formats, N and K of its w13, experts, top_k),
so the cache stores it in the same table; its key names both GEMMs:
`moe_layer:bf16*nvfp4->bf16:w13n512k256:w2n256k256:e8:top2`. Activations are bf16 (a W4A4 layer would
quantize h between the GEMMs under w2's input scale: not defined here yet). `parse_key` reads either
kind of key. No torch here (the cache reads keys with torch blocked); the inputs and the float64
reference are in `layer_inputs`.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from autotune.core.problem import OUT_DTYPES, WEIGHT_FORMATS, Problem

KIND = "moe_layer"
_KEY = re.compile(r"moe_layer:(\w+)\*(\w+)->(\w+):w13n(\d+)k(\d+):w2n(\d+)k(\d+):e(\d+):top(\d+)")


@dataclass(frozen=True, order=True)
class LayerProblem:
    """One MoE layer: N = 2I and K = H are its w13's (the cuda layer member's convention)."""
    kind: str = KIND
    a_fmt: str = "bf16"
    w_fmt: str = "nvfp4"
    out_dtype: str = "bf16"
    n: int = 0
    k: int = 0
    experts: int = 1
    top_k: int = 1
    epilogue: str = "none"

    def __post_init__(self) -> None:
        if self.kind != KIND:
            raise ValueError(f"a layer problem has kind {KIND}, got {self.kind!r}")
        if self.a_fmt != "bf16":
            raise ValueError(f"a moe_layer problem takes bf16 activations, got {self.a_fmt!r}")
        if self.w_fmt not in WEIGHT_FORMATS[:2]:
            raise ValueError(f"a moe_layer problem takes FP4 weights {WEIGHT_FORMATS[:2]}, got {self.w_fmt!r}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"output dtype must be one of {OUT_DTYPES}, got {self.out_dtype!r}")
        if self.epilogue != "none":
            raise ValueError(f"a moe_layer problem has no epilogue of its own, got {self.epilogue!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n <= 0 or self.n % 2:
            raise ValueError(f"a moe_layer problem's N (w13's 2I rows) must be a positive even integer, got {self.n!r}")
        # the pair problems check the rest (K and I against the blocks, experts, top_k)
        object.__setattr__(self, "_pair", (self._w13(), self._w2()))
        object.__setattr__(self, "_key", f"{KIND}:{self.a_fmt}*{self.w_fmt}->{self.out_dtype}:"
                                         f"w13n{self.n}k{self.k}:w2n{self.k}k{self.inter}:e{self.experts}:top{self.top_k}")

    @classmethod
    def of(cls, hidden: int, inter: int, experts: int, top_k: int, w_fmt: str = "nvfp4",
           out_dtype: str = "bf16") -> "LayerProblem":
        return cls(KIND, "bf16", w_fmt, out_dtype, 2 * inter, hidden, experts, top_k)

    @classmethod
    def from_pair(cls, w13: Problem, w2: Problem) -> "LayerProblem":
        """The layer whose pair problems are `w13` and `w2` (as FP4MoE runs them); refuses a pair
        that is not one layer's."""
        layer = cls(KIND, w13.a_fmt, w13.w_fmt, w2.out_dtype, w13.n, w13.k, w13.experts, w13.top_k)
        if layer.pair != (w13, w2):
            raise ValueError(f"{w13.key} and {w2.key} are not the two GEMMs of one MoE layer")
        return layer

    @classmethod
    def from_key(cls, key: str) -> "LayerProblem":
        m = _KEY.fullmatch(key)
        if not m:
            raise ValueError(f"not a moe_layer problem key: {key!r}")
        a, w, o, n13, k13, n2, k2, e, t = m.groups()
        p = cls(KIND, a, w, o, int(n13), int(k13), int(e), int(t))
        if p.key != key:
            raise ValueError(f"not a moe_layer problem key: {key!r} (w2's shape is N={k13}, K={int(n13) // 2})")
        return p

    def _w13(self) -> Problem:
        return Problem.moe(self.n, self.k, self.experts, self.top_k, w_fmt=self.w_fmt, epilogue="swiglu")

    def _w2(self) -> Problem:
        return Problem.moe(self.k, self.n // 2, self.experts, self.top_k, w_fmt=self.w_fmt,
                           out_dtype=self.out_dtype, epilogue="reduce")

    @property
    def key(self) -> str:
        return getattr(self, "_key")

    @property
    def pair(self) -> tuple[Problem, Problem]:
        """(w13, w2): the two grouped-MoE problems the layer chains (h in bf16 between them)."""
        return getattr(self, "_pair")

    @property
    def w13(self) -> Problem:
        return self.pair[0]

    @property
    def w2(self) -> Problem:
        return self.pair[1]

    @property
    def hidden(self) -> int:
        return self.k

    @property
    def inter(self) -> int:
        return self.n // 2

    @property
    def out_n(self) -> int:
        """Output features: H."""
        return self.k

    @property
    def block(self) -> int:
        return self.w13.block

    def to_dict(self) -> dict[str, Any]:
        """The stored columns (the cache's problems table), as a Problem's."""
        d = asdict(self)
        del d["epilogue"]
        return d

    def flops(self, m: int) -> int:
        return self.w13.flops(m) + self.w2.flops(m)

    def __str__(self) -> str:
        return self.key


def parse_key(key: str) -> Problem | LayerProblem:
    """A stored or given problem key of either kind."""
    return LayerProblem.from_key(key) if key.startswith(KIND + ":") else Problem.from_key(key)
