"""The committed nvcc truth table: what the compiler said about each CUTLASS kernel it was given.

`smem_truth.json` (written by tools/cutlass_smem_truth/gen.py, never by CI) holds, per kernel
(its `smem_key`), the builder's stage count, the epilogue carve-out and the kernel's
SharedStorageSize, or nvcc's error. Verdicts come from these rows only: a kernel without a row
was never compiled, and its verdict is unknown rather than a figure extrapolated by the model.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from autotune.tactics.cutlass.candidates import Kernel

PATH = Path(__file__).with_name("smem_truth.json")


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(PATH.read_text())


@lru_cache(maxsize=1)
def rows() -> dict[str, dict]:
    return {r["name"]: r for r in table()["rows"]}


def row(k: Kernel) -> dict | None:
    """nvcc's row for this kernel, or None when it was never compiled."""
    return rows().get(k.smem_key)


def compile_error(r: dict) -> str | None:
    """nvcc's message when the kernel does not compile (a builder static_assert), else None."""
    return r.get("compile_error") or r.get("full_compile_error") or None
