"""Meta: free-form key/value rows (an export's format, checksum and signature; measured ceilings),
and shipping a SQLite file as one file."""
from __future__ import annotations

from typing import Mapping

from sqlalchemy import select

from autotune.cache.schema import Meta
from autotune.cache.tables.db import Db
from autotune.cache.upsert import upsert


class MetaRows(Db):
    def meta(self) -> dict[str, str]:
        return {r.key: r.value for r in self._read(lambda s: s.scalars(select(Meta)).all())}

    def put_meta(self, key: str, value: str) -> None:
        """One free-form key/value row (e.g. measured roofline ceilings, see autotune.report)."""
        self.put_meta_items({key: value})

    def put_meta_items(self, items: Mapping[str, str]) -> None:
        """Several key/value rows in one transaction (an export's format, checksum, signature)."""
        self._write(lambda s: [upsert(s, Meta, {"key": k, "value": v}, ["key"]) for k, v in items.items()])

    def make_self_contained(self) -> None:
        """A SQLite file in rollback-journal mode: one file, no -wal beside it (for shipping)."""
        if self._sqlite and self.path is not None:
            with self.engine.connect() as c:
                c.exec_driver_sql("PRAGMA journal_mode=DELETE")
