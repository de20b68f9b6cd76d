"""Weight layouts per tactic, prepared once at load time and never per call.

Each family names the layout its kernels read (`Family.layout(tactic)`) and produces it
(`Family.pack(layout, weight)`); this module only keeps one packed copy per distinct layout
among the tactics a layer can reach, so buckets whose winners read different layouts each get
theirs and tactics that share a layout share one copy. It never names a family.
"""
from __future__ import annotations

from typing import Any

import torch

from autotune.core.formats import FP4Weight
from autotune.core.tactic import Tactic
from tactics import registry


def layout_of(tactic: Tactic) -> str:
    return registry.get(tactic.family).layout(tactic)


def pack_for(tactic: Tactic, weight: FP4Weight) -> Any:
    """The weight in the layout `tactic`'s kernels read."""
    fam = registry.get(tactic.family)
    return fam.pack(fam.layout(tactic), weight)


def pack_all(owners: tuple[Tactic, ...], w: FP4Weight) -> list[Any]:
    """One packed weight per layout slot: `owners[i]` is the first tactic that reads slot i's
    layout (`Table.layout_owners`), and its family packs it."""
    return [pack_for(t, w) for t in owners]


def _tensors(obj) -> list[torch.Tensor]:
    fields = getattr(obj, "__dataclass_fields__", None)
    vals = [getattr(obj, f) for f in fields] if fields else list(vars(obj).values())
    return [v for v in vals if isinstance(v, torch.Tensor)]


def extra_bytes(source: FP4Weight, packs: list[Any]) -> int:
    """Bytes the packed copies hold beyond the source weight's own storage (shared storage counts 0)."""
    seen = {t.untyped_storage().data_ptr() for t in _tensors(source)}
    total = 0
    for p in packs:
        for t in _tensors(p):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
    return total
