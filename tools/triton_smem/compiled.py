"""One config's compiled figures, in a form that crosses process boundaries (joblib, spawn pools)."""
from __future__ import annotations

from typing import Any, Mapping

from autotune.tactics.triton_fp4.family import cross_compile


def shared_of(fmt: str, params: Mapping[str, Any], arch: Any, cache_dir: str | None = None) -> tuple[int, int]:
    """(metadata.shared, metadata.tmem_size) of the member `params["kernel"]` cross-compiled for
    `arch` to LLVM IR."""
    ck = cross_compile(fmt, dict(params), arch, stop_at="llir", cache_dir=cache_dir)
    return int(ck.metadata.shared), int(getattr(ck.metadata, "tmem_size", 0) or 0)
