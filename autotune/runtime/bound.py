"""A problem's table with one weight bound: what FP4Linear, FP4MoE and engines call per forward.

At bind time (load, and again after `.to()` or a pin) the weight is checked against the problem
once, packed once per layout the reachable tactics read (`Family.layout` / `Family.pack`), and
every reachable tactic becomes a launcher with its packed weight fixed (`Family.bind`). A call
then costs the bucket pick, the launcher's cheap check of x, and the launch.
"""
from __future__ import annotations

from typing import Any

from autotune.core.formats import FP4Weight
from autotune.core.operands import check_weight
from autotune.core.tactic import Tactic
from autotune.runtime.table import DEFAULT_SLOT, PIN_SLOT, Table
from tactics import registry
from tactics.base import Launcher


class BoundTable:
    """`bt(x)` (dense) or `bt(x, topk_ids, topk_weights)` (MoE): pick by M, launch."""

    __slots__ = ("table", "weight", "device", "launchers", "packs", "_pinned", "_default", "_version")

    def __init__(self, table: Table, weight: FP4Weight, device: str):
        check_weight(table.problem, weight)
        self.table = table
        self.weight = weight
        self.device = device
        self.rebind()

    def rebind(self, weight: FP4Weight | None = None) -> None:
        """Pack and bind again (after the weight moved, or a pin changed what the table answers)."""
        if weight is not None:
            check_weight(self.table.problem, weight)
            self.weight = weight
        packs: dict[str, Any] = {}
        t = self.table
        self.launchers: tuple[Launcher, ...] = tuple(self._bind(x, packs) for x in t.tactics)
        self._pinned = self._bind(t.pinned_tactic, packs) if t.pinned_tactic is not None else None
        self._default: Launcher | None = None        # bound on the first miss
        self.packs = packs
        self._version = t.version

    def _bind(self, tactic: Tactic, packs: dict[str, Any]) -> Launcher:
        fam = registry.get(tactic.family)
        lay = fam.layout(tactic)
        if lay not in packs:
            packs[lay] = fam.pack(lay, self.weight)
        return fam.bind(self.table.problem, tactic, packs[lay], self.device)

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
            self._default = self._bind(self.table.default_tactic, self.packs)
        return self._default

    def __call__(self, x, *routing, out=None):
        return self.launcher(x.shape[0])(x, *routing, out=out)

    @property
    def extra_bytes(self) -> int:
        """Memory the packed copies cost beyond the FP4 weight itself (shared storage counts 0)."""
        return extra_bytes(self.weight, list(self.packs.values()))


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
