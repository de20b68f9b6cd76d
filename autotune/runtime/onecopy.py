"""One layout per bound weight (`Dispatcher.bind(..., one_copy=True)`, `FP4Linear(..., one_copy=True)`).

A table whose winners read different layouts (e.g. the cuda family's fragment layout at small M,
Triton's u8 view at M = 64) would otherwise keep one packed copy per layout beside the
checkpoint. Engines that refuse a second copy of the weights bind in one-copy mode: every M is
served from ONE layout, the one the winners of the most rungs up to `upto` read (ties: the
designated default's). `upto` is the M range the engine serves from CUDA graphs (its decode
batches); unless told it is `DECODE_UPTO` (512, the largest batch vLLM captures in CUDA graphs by
default), never every rung: the large-M rungs' layout must not decide the decode kernel (on an
H100, GLM-5 TP8's 78 MLP layers chosen by every rung ran the large-M layout's kernel at M = 1,
2.822 ms a step; chosen by the rungs up to 64, 1.831 ms, 2026-12-07). `Plan.upto` says which
range chose.
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
from autotune.tactics.base import PLAIN_LAYOUT

#: (the rung's bucket M, the stored tactic, the tactic used)
Substitution = tuple[int, Tactic, Tactic]


@dataclass(frozen=True)
class Plan:
    layout: str                          # the one layout every M is served from
    family: str                          # the family whose pack (in place, if it can) makes it
    tactics: tuple[Tactic, ...]          # per rung, the tactic that runs
    default: Tactic                      # what the miss slot runs
    substituted: tuple[Substitution, ...]
    upto: int = 0                        # the M range (rungs up to it) whose winners chose the layout


#: the decode range one copy chooses its layout by unless told (`one_copy_upto`): vLLM's largest
#: default CUDA-graph capture size; an engine that captures other batch sizes passes its largest
DECODE_UPTO = 512


def layout_of(t: Tactic) -> str:
    return registry.get(t.family).layout(t)


def _most(items: Sequence, key=lambda x: x):
    """The most frequent item (ties: the first seen)."""
    keys = [key(x) for x in items]
    return items[max(range(len(items)), key=lambda i: (keys.count(keys[i]), -keys.index(keys[i])))]


#: (bucket M, layout) -> the fastest servable tactic of that layout measured at M, or None
Best = Callable[[int, str], "Tactic | None"]


def plan(table: Table, arch: Arch, device: str, upto: int | None = None, best: Best | None = None) -> Plan:
    """The one layout, and the tactic per rung; `upto` None: DECODE_UPTO."""
    upto = DECODE_UPTO if upto is None else upto
    p, dt = table.problem, table.default_tactic
    if table.pinned_tactic is not None:      # a pin answers every M: its layout is the one, no rungs
        pt = table.pinned_tactic
        return Plan(layout_of(pt), pt.family, (), pt, (), upto)
    lays = [layout_of(x) for x in table.tactics]
    dlay = layout_of(dt)
    layout = dlay
    # the rungs that choose: those up to `upto` (at least the smallest); the others are served too
    voters = [lay for b, lay in zip(table.buckets, lays) if b <= upto] or lays[:1]
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
    return Plan(layout, family, tactics, dt if dlay == layout else sub, subs, upto)


def copies(table: Table) -> int:
    """How many packed copies beside the checkpoint a binding that is not one-copy makes: the
    layouts its tactics read other than the checkpoint's own (PLAIN_LAYOUT)."""
    ts = (table.pinned_tactic,) if table.pinned_tactic is not None else table.tactics
    return len({layout_of(t) for t in ts} - {PLAIN_LAYOUT})


def device_bytes(device: str) -> int | None:
    """The device's memory in bytes (None where it has no fixed size: the CPU)."""
    if device != "cuda":
        return None
    import torch
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


class CopyWatch:
    """A dispatcher's running total of the weights it bound with more than one copy; `bound` warns
    once, in one line, when two copies of the weights bound so far would not fit the device."""

    def __init__(self) -> None:
        self.weights = 0          # checkpoint bytes of every weight bound
        self.extra = 0            # estimated bytes of the packed copies beside them
        self.warned = False

    def bound(self, table: Table, weight_bytes: int, device: str) -> str | None:
        n = copies(table)
        self.weights += weight_bytes
        self.extra += n * weight_bytes
        if self.warned or not self.extra:
            return None
        cap = device_bytes(device)
        if cap is None or 2 * self.weights <= cap:
            return None
        self.warned = True
        return (f"fp4-autotune: the weights bound so far ({self.weights / 2**30:.1f} GiB) are kept in more than one "
                f"layout (~{self.extra / 2**30:.1f} GiB of packed copies); two copies would not fit the device's "
                f"{cap / 2**30:.1f} GiB: Dispatcher(one_copy_upto=M) keeps one copy, its layout chosen by M <= M "
                f"(docs/serving.md, 'One copy in an engine')")
