"""Problem: one GEMM the search tunes, without M (M is dynamic and bucketed).

y[M, N] = x[M, K] · W[N, K]ᵀ. N is the number of output features (weight rows), K the number
of input features. A grouped-MoE problem also carries the expert count E and top_k, and an
epilogue (the fused forms of an MoE block, each its own problem: tuned, checked and dispatched apart):

* "none": y[M, top_k, N], y[i, j] = x[i] · W[ids[i, j]]ᵀ (× topk_weights[i, j] when given);
* "swiglu" (w13, vLLM's [gate; up] rows): y[M, top_k, N/2] = silu(x·W_gateᵀ) · (x·W_upᵀ) (× weight);
* "reduce" (w2): x holds one row per (token, slot), [M, top_k, K]; y[M, N] = Σ_j weight[i, j] ·
  x[i, j] · W[ids[i, j]]ᵀ, slots routed nowhere (-1) contributing nothing.
A dense problem takes "swiglu" too (FP4MLP's gate_up, vLLM's [gate; up] rows): y[M, N/2] =
silu(x·W_gateᵀ) · (x·W_upᵀ); "reduce" is grouped only.
The key names a non-default epilogue (`...:e256:top8:swiglu`, `dense:...:n512:k6144:swiglu`); keys of
"none" problems are unchanged.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Kind = Literal["dense", "grouped_moe"]
ACT_FORMATS = ("bf16", "fp8", "nvfp4", "mxfp4")
WEIGHT_FORMATS = ("nvfp4", "mxfp4", "bf16", "fp8")
OUT_DTYPES = ("bf16", "fp16", "fp32")
EPILOGUES = ("none", "swiglu", "reduce")
#: elements that share one scale, per quantized format
BLOCK = {"nvfp4": 16, "mxfp4": 32}


@dataclass(frozen=True, order=True)
class Problem:
    kind: str = "dense"
    a_fmt: str = "bf16"
    w_fmt: str = "nvfp4"
    out_dtype: str = "bf16"
    n: int = 0
    k: int = 0
    experts: int = 1
    top_k: int = 1
    epilogue: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "grouped_moe"):
            raise ValueError(f"problem kind must be dense or grouped_moe, got {self.kind!r}")
        if self.a_fmt not in ACT_FORMATS:
            raise ValueError(f"activation format must be one of {ACT_FORMATS}, got {self.a_fmt!r}")
        if self.w_fmt not in WEIGHT_FORMATS:
            raise ValueError(f"weight format must be one of {WEIGHT_FORMATS}, got {self.w_fmt!r}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"output dtype must be one of {OUT_DTYPES}, got {self.out_dtype!r}")
        for name in ("n", "k", "experts", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name.upper() if len(name) == 1 else name} must be a positive integer, got {v!r}")
        block = BLOCK.get(self.w_fmt, 1)
        if self.k % block:
            raise ValueError(f"K={self.k} is not a multiple of the {self.w_fmt} block ({block})")
        ablock = BLOCK.get(self.a_fmt, 1)
        if self.k % ablock:
            raise ValueError(f"K={self.k} is not a multiple of the {self.a_fmt} activation block ({ablock})")
        if self.kind == "dense" and (self.experts != 1 or self.top_k != 1):
            raise ValueError("a dense problem has experts=1 and top_k=1")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, got {self.epilogue!r}")
        if self.epilogue == "reduce" and self.kind != "grouped_moe":
            raise ValueError(f"the {self.epilogue} epilogue is a grouped_moe variant, not {self.kind}")
        if self.epilogue == "swiglu" and self.n % 2:
            raise ValueError(f"the swiglu epilogue needs an even N ([gate; up] rows), got N={self.n}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds the expert count {self.experts}")
        object.__setattr__(self, "_key", self._make_key())     # not a field: eq, hash, order, asdict ignore it

    @property
    def key(self) -> str:
        """Stable string key, e.g. 'dense:bf16*nvfp4->bf16:n3072:k6144' (made once, in
        __post_init__: layers name their problem on every call)."""
        return getattr(self, "_key")     # set in __post_init__, not a field (eq, hash, order, asdict skip it)

    def _make_key(self) -> str:
        s = f"{self.kind}:{self.a_fmt}*{self.w_fmt}->{self.out_dtype}:n{self.n}:k{self.k}"
        if self.kind == "grouped_moe":
            s += f":e{self.experts}:top{self.top_k}"
        if self.epilogue != "none":
            s += f":{self.epilogue}"
        return s

    @property
    def block(self) -> int:
        return BLOCK.get(self.w_fmt, 1)

    @classmethod
    def from_key(cls, key: str) -> "Problem":
        m = re.fullmatch(r"(dense|grouped_moe):(\w+)\*(\w+)->(\w+):n(\d+):k(\d+)"
                         r"(?::e(\d+):top(\d+)(?::(swiglu|reduce))?|:(swiglu))?", key)
        if not m or (m.group(1) == "dense") != (m.group(7) is None):
            raise ValueError(f"not a problem key: {key!r}")
        kind, a, w, o, n, k, e, t, epi, dense_epi = m.groups()
        return cls(kind, a, w, o, int(n), int(k), int(e or 1), int(t or 1), epi or dense_epi or "none")

    @classmethod
    def dense(cls, n: int, k: int, w_fmt: str = "nvfp4", a_fmt: str = "bf16", out_dtype: str = "bf16",
              epilogue: str = "none") -> "Problem":
        return cls("dense", a_fmt, w_fmt, out_dtype, n, k, epilogue=epilogue)

    @classmethod
    def moe(cls, n: int, k: int, experts: int, top_k: int, w_fmt: str = "nvfp4", a_fmt: str = "bf16",
            out_dtype: str = "bf16", epilogue: str = "none") -> "Problem":
        return cls("grouped_moe", a_fmt, w_fmt, out_dtype, n, k, experts, top_k, epilogue)

    def variant(self, epilogue: str) -> "Problem":
        """The same GEMM with another epilogue (its fused or unfused form)."""
        return replace(self, epilogue=epilogue)

    @property
    def out_n(self) -> int:
        """Output features: N, or N/2 after SwiGLU."""
        return self.n // 2 if self.epilogue == "swiglu" else self.n

    def to_dict(self) -> dict[str, Any]:
        """The stored columns (the cache's problems table); the key carries the epilogue."""
        d = asdict(self)
        del d["epilogue"]
        return d

    def flops(self, m: int) -> int:
        """Multiply-adds ×2 for M tokens (MoE: each token meets top_k experts)."""
        return 2 * m * self.top_k * self.n * self.k

    def __str__(self) -> str:
        return self.key


def check_m(m: int) -> int:
    if not isinstance(m, int) or isinstance(m, bool) or m <= 0:
        raise ValueError(f"M must be a positive integer, got {m!r}")
    return m
