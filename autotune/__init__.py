"""fp4-autotune: tune FP4 GEMMs, keep the winners in SQLite, dispatch them at run time.

The names below load lazily (PEP 562): `import autotune` costs nothing, `autotune.dispatch`
loads only the runtime layer and `autotune.search` the engine. The layers and what each may
import are in docs/architecture.md.

The families and the cache live at the top of the repository (tactics/, cache/, cli.py) but are
imported only as autotune.tactics, autotune.cache and autotune.cli: three relative links in this
folder (tactics -> ../tactics, cache -> ../cache, cli.py -> ../cli.py) make those names resolve
in a bare checkout (PYTHONPATH=repo root), an editable install and for static tools (grimp,
import-linter, type checkers) alike; the wheel copies the files behind them, so it installs no
top-level `tactics`, `cache` or `cli` for another package or a user's cache.py to shadow.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "search": ("autotune.api", "search"),
    "dispatch": ("autotune.runtime.dispatch", "dispatch"),
    "Dispatcher": ("autotune.runtime.dispatch", "Dispatcher"),
    "FP4Linear": ("autotune.runtime.nn", "FP4Linear"),
    "FP4MoE": ("autotune.runtime.moe", "FP4MoE"),
    "FP4MLP": ("autotune.runtime.nn", "FP4MLP"),
    "FP4GroupedGEMM": ("autotune.runtime.nn", "FP4GroupedGEMM"),
    "Buckets": ("autotune.core.buckets", "Buckets"),
    "FP4Weight": ("autotune.core.formats", "FP4Weight"),
    "quantize": ("autotune.core.formats", "quantize"),
    "Problem": ("autotune.core.problem", "Problem"),
    "Tactic": ("autotune.core.tactic", "Tactic"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value          # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
