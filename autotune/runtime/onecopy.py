"""One layout per bound weight (`Dispatcher.bind(..., one_copy=True)`, `FP4Linear(..., one_copy=True)`).

A table whose winners read different layouts (e.g. the cuda family's fragment layout at small M,
Triton's u8 view at M = 64) would otherwise keep one packed copy per layout beside the
checkpoint. Engines that refuse a second copy of the weights bind in one-copy mode: every M is
served from ONE layout, the one the winners of the most rungs read (ties: the designated
default's); `upto` counts only the rungs up to that M (an engine's decode range, whose batches it
captures in graphs: on GLM-5's folded w13 half the rungs read the cuda layout and half Triton's,
and the tie served Triton's kernel at M = 1..64 in the step bench of 2026-12-05, docs/fp4moe.md#one-copy-of-the-weights).
A rung whose winner reads another layout runs that layout's family default instead
(or, where that default reads yet another layout or cannot run here, the layout's most frequent
winner) — unless `best(bucket, layout)` names the fastest servable trial of that layout the cache
measured at that rung (a whole cache's trials; autotune.runtime.loader.bests_by_layout), which runs
there instead; `Plan.substituted` says which, so the cost is visible. Packing in place is the bound
table's part (autotune.runtime.bound).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from autotune.core.arch import Arch
from autotune.core.tactic import Tactic
from autotune.runtime.table import Table
from autotune.tactics import registry

#: (the rung's bucket M, the stored tactic, the tactic used)
Substitution = tuple[int, Tactic, Tactic]


@dataclass(frozen=True)
class Plan:
    layout: str                          # the one layout every M is served from
    family: str                          # the family whose pack (in place, if it can) makes it
    tactics: tuple[Tactic, ...]          # per rung, the tactic that runs
    default: Tactic                      # what the miss slot runs
    substituted: tuple[Substitution, ...]


def layout_of(t: Tactic) -> str:
    return registry.get(t.family).layout(t)


def _most(items: Sequence, key=lambda x: x):
    """The most frequent item (ties: the first seen)."""
    keys = [key(x) for x in items]
    return items[max(range(len(items)), key=lambda i: (keys.count(keys[i]), -keys.index(keys[i])))]


#: (bucket M, layout) -> the fastest servable tactic of that layout measured at M, or None
Best = Callable[[int, str], "Tactic | None"]


def plan(table: Table, arch: Arch, device: str, upto: int | None = None, best: Best | None = None) -> Plan:
    p, dt = table.problem, table.default_tactic
    if table.pinned_tactic is not None:      # a pin answers every M: its layout is the one, no rungs
        pt = table.pinned_tactic
        return Plan(layout_of(pt), pt.family, (), pt, ())
    lays = [layout_of(x) for x in table.tactics]
    dlay = layout_of(dt)
    layout = dlay
    # the rungs that choose: those up to `upto` (at least the smallest); the others are served too
    voters = [lay for b, lay in zip(table.buckets, lays) if upto is None or b <= upto] or lays[:1]
    if voters:
        counts = {lay: voters.count(lay) for lay in voters}
        layout = max(counts, key=lambda lay: (counts[lay], lay == dlay, -voters.index(lay)))
    inside = [x for x, lay in zip(table.tactics, lays) if lay == layout] or [dt]
    family = dt.family if dlay == layout else _most(inside, key=lambda x: x.family).family
    sub = registry.get(family).default(p, arch)
    if layout_of(sub) != layout or registry.usable(p, sub, arch, device) is not None:
        sub = _most(inside)

    def used(b: int) -> Tactic:
        got = best(b, layout) if best is not None else None
        return got if got is not None and layout_of(got) == layout else sub
    tactics = tuple(x if lay == layout else used(b) for b, x, lay in zip(table.buckets, table.tactics, lays))
    subs = tuple((b, x, u) for b, x, lay, u in zip(table.buckets, table.tactics, lays, tactics) if lay != layout)
    # the miss slot is reached only by a table without rungs, whose layout is the default's
    return Plan(layout, family, tactics, dt if dlay == layout else sub, subs)
