"""A compiler-figure provider for the family's verdicts outside the region the smem model was
checked on: cross-compile the config to LLVM IR (compile.py, no GPU needed) and read
`metadata.shared` and `metadata.tmem_size`.

Figures are cached per (Triton version, arch, weight format, tactic, member sources) in memory and
in one of: the tactic cache (`memo=`, a Store: its compiler_figures table, shared by every search
on that cache and safe under concurrent writers), or a JSON file (`path=`; one process writes it
at a time; a damaged file is ignored and rewritten). A config that does not compile is remembered
too (the verdict stays unknown, naming the error), so no search compiles it twice. The live search
gives the family one over its cache (`Family.with_compiler_figures`); the family never makes one
on its own.
"""
from __future__ import annotations

import json
import os
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from typing import Any

from autotune.core.arch import Arch
from autotune.core.codekey import digest
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from .members import cross_compile, member_of


def triton_version() -> str | None:
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


class CompiledFigures:
    """provider(problem, tactic, arch) -> (shared bytes, tmem columns), or None when the config does
    not compile (the verdict then stays unknown, with the failure counted in `failures`)."""

    def __init__(self, path: str | os.PathLike | None = None, compiler_version: str | None = None,
                 triton_cache: str | None = None, memo: Any = None):
        self.version = compiler_version or triton_version()
        self.path = Path(path) if path is not None else None
        self.memo = memo                        # a Store (compiler_figure / put_compiler_figure), or None
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

    def why(self, problem: Problem, tactic: Tactic, arch: Arch) -> str | None:
        """Why this provider gave no figure for the config (its compile error), if it tried."""
        return self.failures.get(self.key(problem, tactic, arch))

    def _stored(self, problem: Problem, tactic: Tactic, arch: Arch) -> tuple | None:
        """(compiler, arch, format, tactic id, sources digest): the row key in the tactic cache."""
        return (f"triton {self.version}", arch.name, problem.w_fmt, tactic.id,
                digest(member_of(tactic.get("kernel")).code))

    def _remember(self, row: tuple, shared, tmem, error) -> None:
        if self.memo is None:
            return
        try:
            self.memo.put_compiler_figure(*row, shared, tmem, error)
        except Exception:               # a read-only or failing cache: the figure stays in memory only
            pass

    def __call__(self, problem: Problem, tactic: Tactic, arch: Arch) -> tuple[int, int] | None:
        if self.version is None:
            return None                 # no Triton here: nothing to ask
        k = self.key(problem, tactic, arch)
        with self._lock:
            hit = self._memo.get(k)
        if hit is not None:
            return hit[0], hit[1]
        if k in self.failures:
            return None
        row = self._stored(problem, tactic, arch) if self.memo is not None else None
        got = self.memo.compiler_figure(*row) if row is not None else None
        if got is not None:
            shared, tmem, error = got
            if error is not None or shared is None:
                self.failures[k] = error or "no figure"
                return None
            with self._lock:
                self._memo[k] = [int(shared), int(tmem or 0)]
            return int(shared), int(tmem or 0)
        try:
            ck = cross_compile(problem.w_fmt, tactic.params, arch, stop_at="llir", cache_dir=self.triton_cache)
        except Exception as e:          # does not compile (or not for this target): no figure
            self.failures[k] = f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"
            if row is not None:
                self._remember(row, None, None, self.failures[k])
            return None
        fig = [int(ck.metadata.shared), int(getattr(ck.metadata, "tmem_size", 0) or 0)]
        if row is not None:
            self._remember(row, fig[0], fig[1], None)
        with self._lock:
            self.compiles += 1
            self._memo[k] = fig
            if self.path is not None:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._memo, sort_keys=True))
                os.replace(tmp, self.path)
        return fig[0], fig[1]
