"""Misses: how often dispatch met an M of a problem that had no winner, per device."""
from __future__ import annotations

from typing import Iterable

from sqlalchemy import select

from autotune.core.records import Miss

from autotune.cache.columns import MISS, MISS_KEY, names, to_row
from autotune.cache.schema import MissRow
from autotune.cache.tables.db import Db
from autotune.cache.upsert import upsert

_NAMES = names(MISS)


class Misses(Db):
    def record_misses(self, misses: Iterable[Miss]) -> None:
        rows = [to_row(m, MISS) for m in misses]
        if rows:
            self._write(lambda s: [upsert(s, MissRow, r, list(MISS_KEY), "add", "count") for r in rows])

    def misses(self, device_key: str | None = None) -> list[Miss]:
        q = select(*self._cols(MissRow, MISS))
        if device_key is not None:
            q = q.where(MissRow.device_key == device_key)
        q = q.order_by(MissRow.device_key, MissRow.problem_key, MissRow.m)
        return [Miss(**{c: getattr(r, c) for c in _NAMES}) for r in self._read(lambda s: s.execute(q).all())]
