"""A problem's table with one weight bound: what FP4Linear, FP4MoE and engines call per forward.

At bind time (load, and again after `.to()` or a pin) the weight is checked against the problem
once, packed once per layout the reachable tactics read (`Family.layout` / `Family.pack`), and
every reachable tactic becomes a launcher with its packed weight fixed (`Family.bind`). A call
then costs the bucket pick, the launcher's cheap check of x, and the launch.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

from autotune.core.arch import Arch
from autotune.core.formats import HELD_LAYOUT, FP4Weight
from autotune.core.operands import check_weight
from autotune.core.tactic import Tactic
from autotune.runtime import onecopy
from autotune.runtime.onecopy import Substitution
from autotune.runtime.table import DEFAULT_SLOT, PIN_SLOT, Table
from autotune.tactics import registry
from autotune.tactics.base import Launcher

log = logging.getLogger("autotune.runtime.bound")


class BoundTable:
    """`bt(x)` (dense) or `bt(x, topk_ids, topk_weights)` (MoE): pick by M, launch.

    one_copy=True (needs `arch`): every M is served from one layout (autotune.runtime.onecopy;
    `layout`, `substituted`; one_copy_upto: the layout is chosen by the rungs up to that M; best:
    (bucket, layout) -> the measured best of that layout, run on a substituted rung), packed in
    place over the weight's own storage where its family can (`Family.pack_inplace`; then `held`
    names it, `extra_bytes` is 0, and the weight is marked so nothing reads those bytes as a
    checkpoint-layout weight again).

    scratch: the dispatcher's ScratchPool (tactics/scratch.py): every launcher bound here takes its
    workspaces from it (`Launcher.attach`), so layers share one set per stream. bad_word: a
    function(device) -> the int32 word grouped-MoE launchers set for bad ids (FP4MoE's, one per
    layer and device); None: each launcher keeps its own."""

    __slots__ = ("table", "_weight", "device", "launchers", "packs", "_pinned", "_default", "_default_tactic",
                 "_version", "one_copy", "one_copy_upto", "best", "arch", "layout", "held", "substituted", "scratch",
                 "bad_word")

    def __init__(self, table: Table, weight: FP4Weight, device: str, *, one_copy: bool = False,
                 arch: Arch | None = None, scratch: Any = None, bad_word: Any = None,
                 one_copy_upto: int | None = None, best: Any = None):
        if one_copy and arch is None:
            raise ValueError("a one-copy binding needs the arch its substitute tactics are judged on")
        check_weight(table.problem, weight)
        self.table, self._weight, self.device = table, weight, device
        self.scratch, self.bad_word = scratch, bad_word
        self.one_copy, self.arch, self.one_copy_upto, self.best = one_copy, arch, one_copy_upto, best
        self.layout: str | None = None                  # one_copy: the one layout every M reads
        self.held: str | None = None                    # the layout written over the weight's storage
        self.substituted: tuple[Substitution, ...] = ()  # one_copy: (bucket M, stored, used) per rung
        self.rebind()

    @property
    def weight(self) -> FP4Weight:
        """The bound checkpoint-layout weight (refused once a one-copy binding packed it in place)."""
        if self.held is not None:
            raise ValueError(f"{self.table.problem.key}: the bound weight's bytes hold the {self.held} layout "
                             f"(packed in place, one_copy); there is no checkpoint-layout weight to read")
        return self._weight

    def rebind(self, weight: FP4Weight | None = None) -> None:
        """Pack and bind again (after the weight moved, or a pin changed what the table answers).
        On an error the previous binding stays."""
        if self.one_copy:
            return self._rebind_one(self._weight if weight is None else weight)
        if weight is not None:
            check_weight(self.table.problem, weight)
        w, t, packs = self._weight if weight is None else weight, self.table, {}
        # a pin answers every M: only its launcher (and its layout's pack) is made
        pinned = self._bind(t.pinned_tactic, w, packs) if t.pinned_tactic is not None else None
        launchers = () if pinned is not None else tuple(self._bind(x, w, packs) for x in t.tactics)
        self._commit(w, packs, launchers, pinned, t.default_tactic)

    def _rebind_one(self, w: FP4Weight) -> None:
        t, p = self.table, self.table.problem
        plan = onecopy.plan(t, self.arch, self.device, self.one_copy_upto, self.best)
        lay = plan.layout
        if self.held is not None and lay != self.held:
            raise ValueError(f"{p.key}: the weight holds the {self.held} layout in place; the table now wants {lay} "
                             "(unpin, or bind without one_copy)")
        fam = registry.get(plan.family)
        if self.held is not None:               # moved (or rebound) bytes in the layout: wrap, never pack twice
            pk = fam.pack_inplace(lay, w, already_packed=True)
            _check_pack(p, pk, lay, plan.family)
            setattr(w.packed, HELD_LAYOUT, lay)
        else:
            check_weight(p, w)
            pk = fam.pack_inplace(lay, w)
            if pk is None:
                pk = fam.pack(lay, w)           # a layout its family cannot write in place (a view, or a copy)
            else:                               # the checkpoint bytes are gone: record it before anything else
                setattr(w.packed, HELD_LAYOUT, lay)
                self._weight, self.held = w, lay
                _check_pack(p, pk, lay, plan.family)
        packs = {lay: pk}
        launchers = tuple(self._bind(x, w, packs) for x in plan.tactics)
        pinned = self._bind(t.pinned_tactic, w, packs) if t.pinned_tactic is not None else None
        if plan.substituted and plan.substituted != self.substituted:
            msg = (f"fp4-autotune: {p.key} bound with one copy of the weight ({lay}): "
                   + ", ".join(f"M={b} runs {u} instead of {s}" for b, s, u in plan.substituted))
            log.info(msg)
            warnings.warn(msg, stacklevel=3)
        self.layout, self.substituted = lay, plan.substituted
        self._commit(w, packs, launchers, pinned, plan.default)

    def _commit(self, w: FP4Weight, packs: dict[str, Any], launchers: tuple[Launcher, ...],
                pinned: Launcher | None, default_tactic: Tactic) -> None:
        self._weight, self.packs, self.launchers, self._pinned = w, packs, launchers, pinned
        self._default: Launcher | None = None        # bound on the first miss
        self._default_tactic = default_tactic
        self._version = self.table.version

    def _bind(self, tactic: Tactic, weight: FP4Weight, packs: dict[str, Any]) -> Launcher:
        fam = registry.get(tactic.family)
        lay = fam.layout(tactic)
        if lay not in packs:
            packs[lay] = fam.pack(lay, weight)
        launcher = fam.bind(self.table.problem, tactic, packs[lay], self.device)
        if self.scratch is not None or self.bad_word is not None:
            word = None if self.bad_word is None else self.bad_word(weight.packed.device)
            launcher.attach(self.scratch, word)
        return launcher

    def launcher(self, m: int) -> Launcher:
        """The launcher for M (counted on the table's rungs)."""
        if self._version != self.table.version:
            self.rebind()
        i = self.table.index(m)
        if i >= 0:
            return self.launchers[i]
        if i == PIN_SLOT:
            return self._pinned
        assert i == DEFAULT_SLOT
        if self._default is None:
            self._default = self._bind(self._default_tactic, self._weight, self.packs)
        return self._default

    def __call__(self, x, *routing, out=None):
        return self.launcher(x.shape[0])(x, *routing, out=out)

    @property
    def extra_bytes(self) -> int:
        """Memory the packed copies cost beyond the FP4 weight itself (shared storage counts 0)."""
        return extra_bytes(self._weight, list(self.packs.values()))


def _check_pack(p, pk: Any, lay: str, family: str) -> None:
    if pk is None or getattr(pk, "layout", None) != lay:
        raise TypeError(f"{p.key}: {family}.pack_inplace gave {type(pk).__name__}, not a pack with layout={lay!r}")
    check_weight(p, pk)


def _tensors(obj) -> list:
    import torch
    fields = getattr(obj, "__dataclass_fields__", None)
    vals = [getattr(obj, f) for f in fields] if fields else list(vars(obj).values())
    return [v for v in vals if isinstance(v, torch.Tensor)]


def extra_bytes(source: FP4Weight, packs: list[Any]) -> int:
    seen = {t.untyped_storage().data_ptr() for t in _tensors(source)}
    total = 0
    for p in packs:
        for t in _tensors(p):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
    return total
