"""Which cuda kernel texts have passed their GPU tests (gpu_checked.json beside this file).

A kernel that fits is `unknown` to the search until the exact text it compiles has passed its GPU
tests on hardware: the record holds, per kernel, the digest of that text (build.source_text: the
shared helpers and the kernel) with the test log it passed. Any edit to a kernel's text makes it
unknown again by itself: no flag to remember to clear. `tools/mark_gpu_checked.py` writes the
record from a passing GPU-test log; bench/h200_main_job.sh runs it in the device call that ran the
tests, so the main job there measures the kernels just checked, and the session commits the record
it leaves in $OUT. CPU tests, the grid ports and ptxas prove a kernel's indexing, tiling and shared
memory, not its results on hardware: that is what the record stands for.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from . import build as B

RECORD = Path(__file__).with_name("gpu_checked.json")


@lru_cache(maxsize=None)
def digest(kernel: str) -> str:
    """16 hex digits of sha256 over kernel `kernel`'s text (read once per process)."""
    return hashlib.sha256(B.source_text(kernel).encode()).hexdigest()[:16]


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a GPU-check record is a JSON object of kernel -> entry")
    return data


def record(path: Path | None = None) -> dict:
    """The record (RECORD unless `path`): kernel -> {"digest", "log" (its name under docs/data/),
    "passed", "date", "gpu"}; {} when there is none."""
    path = RECORD if path is None else path
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    return _load(str(path), st.st_mtime_ns)


def checked(kernel: str, path: Path | None = None) -> bool:
    """Whether kernel `kernel`'s current text is the one its GPU tests passed on."""
    entry = record(path).get(kernel)
    return isinstance(entry, dict) and entry.get("digest") == digest(kernel)


def unrun(kernel: str) -> str:
    """The `unknown` verdict's reason for a kernel whose text has not passed its GPU tests."""
    return f"unknown: this {kernel} text has not passed its GPU tests (gpu_checked.json); --measure-unknown measures it"


def awaiting_record(verdict) -> bool:
    """A verdict that is `unknown` only because its kernel's text has no GPU-check record (kept by the
    exact rules): what the search sees as kept once the GPU tests have recorded that text."""
    return verdict.ok is None and verdict.reason in {unrun(k) for k in B.SOURCES}
