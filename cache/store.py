"""Store: the persistent tactic cache (SQLite by default, any SQLAlchemy URL accepted).

Every method takes and returns the plain records of autotune.core.records; ORM rows never leave the
cache package. Writes are short transactions (one per trial) retried on "database is locked", so
several tuning processes can share one SQLite file in WAL mode.

`Store` is a façade over one module per table (autotune.cache.tables: trials, winners, misses, meta,
devices, and the pruning that spans them), all on one connection (tables.db.Db).
"""
from __future__ import annotations

from autotune.cache.files import CacheError
from autotune.cache.tables.devices import Devices
from autotune.cache.tables.meta import MetaRows
from autotune.cache.tables.misses import Misses
from autotune.cache.tables.pruning import Pruning

__all__ = ["Store", "CacheError"]


class Store(Pruning, Devices, Misses, MetaRows):
    """The tactic cache. `url` is a path or SQLAlchemy URL (default: default_url())."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._where!r}{', readonly=True' if self.readonly else ''})"
