"""The search strategies, registered by name: what a search measures per (problem, bucket) and how.

Each strategy is one module of this package (a class following `base.Strategy`, usually a subclass of
`base.HalvingStrategy`); this registry is
the only place that lists them, so the CLI's `--strategy` choices and help, `SearchOptions`'
validation and the search's lookup all read it. Nothing here imports a strategy module (they load
torch): `get` does, on first use.

A new strategy is one file and one `register(...)` line below (or a `register` call at run time:
tests, notebooks).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    name: str
    target: str        # "module:Class"
    help: str          # one line for `--strategy`'s help


_REGISTRY: dict[str, Entry] = {}
_LOADED: dict[str, Any] = {}


def register(name: str, target: str, help: str) -> None:
    """Add (or replace) a strategy: `target` is "module:Class", its class following base.Strategy."""
    if ":" not in target:
        raise ValueError(f"strategy {name!r}: target must be 'module:Class', got {target!r}")
    _REGISTRY[name] = Entry(name, target, help)
    _LOADED.pop(name, None)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
    _LOADED.pop(name, None)


register("ranked", "autotune.engine.strategies.ranked.strategy:RankedStrategy",
         "only the rank model's top candidates, its bests, neighbouring buckets' winners and the default, with an adaptive "
         "stop (no model for the arch: halving)")
register("halving", "autotune.engine.strategies.halving:HalvingStrategy", "every kept tactic, successive halving")
register("exhaustive", "autotune.engine.strategies.exhaustive:ExhaustiveStrategy", "every kept tactic fully timed")
register("predict", "autotune.engine.strategies.predict:PredictStrategy",
         "nothing timed: the rank model's first choice per (problem, bucket), checked against float64 and under "
         "graph replay and stored as predicted (no model for the arch: the family defaults)")

#: the strategy a search uses unless told (with --batch-invariant every candidate needs a time in every bucket)
DEFAULT, INVARIANT_DEFAULT = "ranked", "halving"


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def default(batch_invariant: bool = False) -> str:
    return INVARIANT_DEFAULT if batch_invariant else DEFAULT


def help_text() -> str:
    """`--strategy`'s help: each strategy's line, then the defaults."""
    return ("; ".join(f"{e.name}: {e.help}" for e in _REGISTRY.values())
            + f" [default: {DEFAULT}; {INVARIANT_DEFAULT} with --batch-invariant]")


def get(name: str):
    """The strategy class registered as `name` (imported on first use)."""
    if name not in _REGISTRY:
        raise ValueError(f"strategy must be one of {', '.join(_REGISTRY)}, got {name!r}")
    if name not in _LOADED:
        mod, cls = _REGISTRY[name].target.split(":")
        _LOADED[name] = getattr(importlib.import_module(mod), cls)
    return _LOADED[name]


def of(o) -> tuple[Any, Any]:
    """(the strategy object of a search with options `o`, the options as it runs them);
    `--exhaustive` (Halving.exhaustive) is `--strategy exhaustive`."""
    s = get("exhaustive" if o.halving.exhaustive else o.strategy)()
    return s, s.configure(o)
