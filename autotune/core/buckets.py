"""Bucket sets for the dynamic M dimension.

A runtime M maps to the smallest bucket >= M, clamped to the largest (FlashInfer rounds up the
same way). The default set is FlashInfer's hybrid one: powers of two up to 256, steps of 256 to
2048, steps of 512 to 4096, powers of two beyond, plus the maximum itself.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterable

#: the largest M a bucket may have (int32 row indexing)
MAX_M = 2**31 - 1
#: the largest vllm:N / sglang:N: the capture-size lists grow by one entry per 16 (32) tokens, so
#: N is bounded before the list is built (65536 gives 4,131 vLLM sizes)
MAX_CAPTURE = 65536


def hybrid(max_tokens: int = 8192) -> tuple[int, ...]:
    if max_tokens < 1:
        raise ValueError(f"max tokens must be >= 1, got {max_tokens}")
    out: set[int] = set()
    m = 1
    while m <= min(256, max_tokens):
        out.add(m)
        m *= 2
    out.update(range(512, min(2048, max_tokens) + 1, 256))
    out.update(range(2560, min(4096, max_tokens) + 1, 512))
    m = 8192
    while m <= max_tokens:
        out.add(m)
        m *= 2
    out.add(max_tokens)
    return tuple(sorted(out))


def vllm_cudagraph_sizes(max_size: int = 512) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, 8..248 by 8, 256.. by 16."""
    sizes = [1, 2, 4] + list(range(8, min(max_size + 1, 256), 8)) + list(range(256, max_size + 1, 16))
    return tuple(s for s in sizes if s <= max_size)


def sglang_cudagraph_sizes(max_bs: int = 256) -> tuple[int, ...]:
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return tuple(s for s in sizes if s <= max_bs)


@dataclass(frozen=True)
class Buckets:
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        vals = tuple(sorted(set(self.values)))
        if not vals:
            raise ValueError("a bucket set needs at least one value")
        for v in vals:
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"bucket sizes must be positive integers, got {v!r}")
        object.__setattr__(self, "values", vals)

    @classmethod
    def of(cls, values: Iterable[int]) -> "Buckets":
        return cls(tuple(values))

    @classmethod
    def parse(cls, text: str) -> "Buckets":
        """'1,2,4,8' or 'hybrid:8192' or 'vllm:512' or 'sglang:256'."""
        text = text.strip()
        for name, fn, most in (("hybrid", hybrid, MAX_M), ("vllm", vllm_cudagraph_sizes, MAX_CAPTURE),
                               ("sglang", sglang_cudagraph_sizes, MAX_CAPTURE)):
            if text.startswith(name + ":"):
                n = _int(text[len(name) + 1:])
                if n > most:
                    raise ValueError(f"{name}:{n} is larger than {name}:{most}, the largest supported")
                return cls(fn(n))
        return cls(tuple(_int(p) for p in text.split(",") if p.strip()))

    def bucket(self, m: int) -> int:
        """The smallest bucket >= m, clamped to the largest."""
        if m <= 0:
            raise ValueError(f"M must be a positive integer, got {m!r}")
        i = bisect_left(self.values, m)
        return self.values[min(i, len(self.values) - 1)]

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def bucket_key(m: int) -> str:
    return f"m{m}"


def _int(s: str) -> int:
    s = s.strip()
    digits = s.lstrip("+-")
    if len(digits) > 19 and digits.isdigit():   # never converted: int() of 5000 digits is slow
        shown = s if len(s) <= 40 else f"a {len(digits)}-digit integer"
        if s.startswith("-"):
            raise ValueError(f"bucket sizes must be positive integers, got {shown}")
        raise ValueError(f"bucket {shown} is larger than {MAX_M}, the largest M supported")
    if len(s) > 40:
        raise ValueError(f"bucket size must be an integer, got {s[:37]!r}...")
    try:
        return int(s)
    except ValueError:
        raise ValueError(f"bucket size must be an integer, got {s.strip()!r}") from None
