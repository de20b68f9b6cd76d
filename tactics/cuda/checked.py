"""Which cuda kernels' code has passed its GPU tests (gpu_checked.json beside this file).

A kernel that fits is `unknown` to the search until the exact code its GPU tests exercised has
passed them on hardware: the record holds, per kernel, the digest (autotune.core.codekey, the
mechanism code keys use) of the files its text joins (build.SOURCES), the Python that compiles it
(build: its -D options, layout: the bit constants) and launches it (its launcher, pdl), with the
test log it passed. Any edit there makes the kernel unknown again by itself: no flag to remember to
clear. `tools/mark_gpu_checked.py` writes the record from a passing GPU-test log;
bench/h200_main_job.sh runs it in the device call that ran the tests, so the main job there measures
the kernels just checked, and the session commits the record it leaves in $OUT. CPU tests, the grid
ports and ptxas prove a kernel's indexing, tiling and shared memory, not its results on hardware:
that is what the record stands for.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from autotune.core.codekey import Code, digest as code_digest

from . import build as B
from . import members as M

RECORD = Path(__file__).with_name("gpu_checked.json")
#: each kernel's launch code (relative to this package), besides members.COMMON_CODE (members.py)
LAUNCH = M.launch()


def code(kernel: str) -> Code:
    """What kernel `kernel`'s GPU tests exercise, as a codekey.Code: its member's files and launch Python."""
    return M.by_kernel()[kernel].code_of(f"gpu-check/{kernel}")


def digest(kernel: str, root: Path | None = None) -> str:
    """16 hex digits over `code(kernel)` as installed (cached per process), or as found under `root`."""
    return code_digest(code(kernel), root)


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


def checked(kernel: str, path: Path | None = None, root: Path | None = None) -> bool:
    """Whether kernel `kernel`'s current code (under `root`: a modified copy) is what its GPU tests passed on."""
    entry = record(path).get(kernel)
    return isinstance(entry, dict) and entry.get("digest") == digest(kernel, root)


def unrun(kernel: str) -> str:
    """The `unknown` verdict's reason for a kernel whose code has not passed its GPU tests."""
    return f"unknown: this {kernel} code has not passed its GPU tests (gpu_checked.json); --measure-unknown measures it"


def awaiting_record(verdict) -> bool:
    """A verdict that is `unknown` only because its kernel's code has no GPU-check record (kept by the
    exact rules): what the search sees as kept once the GPU tests have recorded that code."""
    return verdict.ok is None and verdict.reason in {unrun(k) for k in B.SOURCES}
