"""Which (Triton version, arch, weight format) combinations compile, per kernel of the family.

A rejection reason beside shared memory: verdicts never compile, so what is known to fail is a
table, read with the installed Triton's version from package metadata (no import). Entries are
observations, each with where it was seen; an unlisted combination is assumed to compile (the
search's compile step records a failure if it does not).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class Known:
    kernel: str                  # family kernel name, or "dot_scaled" for tl.dot_scaled kernels
    fmt: str                     # weight format
    cc_major: tuple[int, ...]    # arch majors it applies to
    below: tuple[int, int]       # Triton versions below this fail
    reason: str


KNOWN: tuple[Known, ...] = (
    # Probe on the H200 (Triton 3.6.0, 2026-11-29): tl.dot_scaled with e4m3 scales and
    # group 16 fails in TritonGPUAccelerateMatmul on sm90, MXFP4 compiles and is exact.
    Known("dot_scaled", "nvfp4", (9,), (3, 7),
          "tl.dot_scaled with NVFP4 (e4m3 scales, group 16) does not compile on sm90 with Triton < 3.7 "
          "(TritonGPUAccelerateMatmul)"),
)


@lru_cache(maxsize=1)
def installed_triton() -> tuple[int, int] | None:
    try:
        from importlib.metadata import version
        parts = version("triton").split(".")
        return int(parts[0]), int(parts[1])
    except Exception:
        return None


def rejection(kernel: str, fmt: str, arch: Any, version: tuple[int, int] | None = None) -> str | None:
    """Why `kernel` for `fmt` cannot compile on `arch` with this Triton, or None."""
    v = version or installed_triton()
    if v is None:
        return None
    for k in KNOWN:
        if k.kernel == kernel and k.fmt == fmt and arch.cc[0] in k.cc_major and v < k.below:
            return f"{k.reason} (installed {v[0]}.{v[1]})"
    return None
