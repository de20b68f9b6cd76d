"""Family registry: names map to module paths, imported lazily, so a missing optional backend
costs nothing until it is asked for and then fails with a message that names it."""
from __future__ import annotations

import importlib
from functools import lru_cache

from autotune.core.tactic import Tactic
from tactics.base import Family

FAMILIES: dict[str, str] = {
    "torch": "tactics.torch_ref:TorchFamily",
    "triton": "tactics.triton_fp4.family:TritonFamily",
    "cutlass": "tactics.cutlass.family:CutlassFamily",
    "cublaslt": "tactics.cublaslt:CublasLtFamily",
}


_BUILTIN = dict(FAMILIES)


def extra() -> dict[str, str]:
    """Families registered at run time (tests, plugins): worker processes register them too."""
    return {k: v for k, v in FAMILIES.items() if _BUILTIN.get(k) != v}


def names() -> list[str]:
    return list(FAMILIES)


@lru_cache(maxsize=None)
def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown tactic family {name!r}; known: {', '.join(FAMILIES)}")
    mod, _, cls = FAMILIES[name].partition(":")
    try:
        return getattr(importlib.import_module(mod), cls)()
    except ImportError as e:
        raise ImportError(f"tactic family {name!r} cannot be imported: {e}") from e


def parse(names_csv: str) -> list[Family]:
    """'triton,torch' -> family objects, in the order given, duplicates dropped."""
    out: list[Family] = []
    for n in dict.fromkeys(p.strip() for p in names_csv.split(",") if p.strip()):
        out.append(get(n))
    if not out:
        raise ValueError("no tactic family given")
    return out


def validate(family: str, params: dict) -> str | None:
    """Why (family, params) is not a valid tactic, or None. Used when importing caches."""
    if family not in FAMILIES:
        return f"unknown family {family!r}"
    try:
        return get(family).validate(Tactic(family, params))
    except (TypeError, ValueError) as e:
        return str(e)
