"""Drop the rows of environments no longer wanted (`autotune cache prune`).

The SQL is the Store's (Store.prune); what "stale" means per family — the library versions it
depends on — comes from the family registry, which is why this is an integration. Pruning by
device or misses loads no family (and no torch), so a build machine without torch can do it."""
from __future__ import annotations

from dataclasses import dataclass

from autotune.core.env import Env
from autotune.cache.exportfile import select_devices
from autotune.cache.store import Store

__all__ = ["PruneReport", "prune", "select_devices"]


@dataclass
class PruneReport:
    trials: int = 0
    winners: int = 0
    misses: int = 0
    devices: int = 0


def _wanted_lib_keys(store: Store, env: Env) -> dict[str, str | None]:
    """family -> the lib_key its rows have under env's library versions (None: a family this
    install does not know, all of whose rows are stale)."""
    from autotune.tactics import registry     # loads the families (and torch): only --stale-libs needs them
    out: dict[str, str | None] = {}
    for fam in store.families():
        try:
            out[fam] = env.lib_key(registry.get(fam).depends_on)
        except (ValueError, ImportError):
            out[fam] = None
    return out


def prune(store: Store, *, keep_devices: set[str] | None = None, drop_devices: set[str] = frozenset(),
          stale_libs: Env | None = None, drop_misses: bool = False, dry_run: bool = False,
          stale_code: bool = False) -> PruneReport:
    """Drop trials, winners and misses of environments no longer wanted.

    keep_devices: device keys to keep (everything else goes); drop_devices: device keys to drop;
    stale_libs: an Env whose device keeps only rows measured under its current library versions
    (per family); drop_misses: also clear recorded misses of the kept devices; stale_code: drop the
    trials and winners (of every device) whose code key is not this install's code's
    (autotune.tactics.registry.stale_code; rows of a family unknown here are kept: they cannot be judged).
    """
    stale = (stale_libs.device_key, _wanted_lib_keys(store, stale_libs)) if stale_libs is not None else None
    c = store.prune(keep_devices=keep_devices, drop_devices=drop_devices, stale=stale,
                    drop_misses=drop_misses, dry_run=dry_run)
    rep = PruneReport(c["trials"], c["winners"], c["misses"], c["devices"])
    if stale_code:
        from autotune.tactics import registry
        # after the SQL pass (a dry run counts rows that pass would have dropped again: an upper bound)
        got = store.prune_where(lambda r: registry.stale_code(r) is not None, dry_run=dry_run)
        rep.trials, rep.winners = rep.trials + got["trials"], rep.winners + got["winners"]
    return rep
