"""A compiler-figure provider for the family's verdicts outside the region the smem model was
checked on: cross-compile the config to LLVM IR (compile.py, no GPU needed) and read
`metadata.shared` and `metadata.tmem_size`.

Figures are cached per (Triton version, arch, weight format, tactic) in memory and, when a path is
given, in a JSON file (one process writes it at a time; a damaged file is ignored and rewritten).
A caller that wants these figures creates one and passes it to the family
(`TritonFamily(compiler=...)` or `family.with_compiler(...)`); the engine passes none, so its
verdicts outside the region stay unknown; the family never creates one itself.
"""
from __future__ import annotations

import json
import os
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from .family import cross_compile


def triton_version() -> str | None:
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


class CompiledFigures:
    """provider(problem, tactic, arch) -> (shared bytes, tmem columns), or None when the config does
    not compile (the verdict then stays unknown, with the failure counted in `failures`)."""

    def __init__(self, path: str | os.PathLike | None = None, compiler_version: str | None = None,
                 triton_cache: str | None = None):
        self.version = compiler_version or triton_version()
        self.path = Path(path) if path is not None else None
        self.triton_cache = triton_cache        # Triton's own cache dir for the compiles (None: its default)
        self.compiles = 0
        self.failures: dict[str, str] = {}
        self._lock = threading.Lock()
        self._memo: dict[str, list[int]] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self._memo = {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 2}
            except (OSError, ValueError):
                self._memo = {}

    def key(self, problem: Problem, tactic: Tactic, arch: Arch) -> str:
        return f"triton {self.version}|{arch.name}|{problem.w_fmt}|{tactic.to_json()}"

    def __call__(self, problem: Problem, tactic: Tactic, arch: Arch) -> tuple[int, int] | None:
        if self.version is None:
            return None                 # no Triton here: nothing to ask
        k = self.key(problem, tactic, arch)
        with self._lock:
            hit = self._memo.get(k)
        if hit is not None:
            return hit[0], hit[1]
        try:
            ck = cross_compile(problem.w_fmt, tactic.params, arch, stop_at="llir", cache_dir=self.triton_cache)
        except Exception as e:          # does not compile (or not for this target): no figure
            self.failures[k] = f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"
            return None
        fig = [int(ck.metadata.shared), int(getattr(ck.metadata, "tmem_size", 0) or 0)]
        with self._lock:
            self.compiles += 1
            self._memo[k] = fig
            if self.path is not None:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._memo, sort_keys=True))
                os.replace(tmp, self.path)
        return fig[0], fig[1]
