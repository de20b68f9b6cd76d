"""The Store's rows of schema 3 (issue #24): the code key's readers and writers that are not plain
SQL — dropping the rows a family's judgement calls stale — and the compiler figures the search
keeps per (compiler, arch, format, tactic, member sources). A mixin of `Store`, apart so each
module stays small; it uses the Store's `_read`, `_write`, `_cols` and `schema_version`."""
from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from autotune.core.records import Trial, Winner
from autotune.cache.schema import CompilerFigureRow, TacticRow, TrialRow, WinnerRow
from autotune.cache.upsert import upsert

#: the schema that added code keys (and compiler figures); an older file opened read-only has neither
_CODE_KEYS = 3
#: the schema that added `replay_checked` to trials and winners; an older file reads False
_REPLAY_CHECKED = 4
#: a trial's columns as the Store reads and writes them
_TRIAL_COLS = ("problem_key", "bucket", "tactic_id", "family", "device_key", "lib_key", "status", "reason",
               "median_us", "iqr_us", "reps", "rel_err", "smem_model", "smem_compiled", "exit_signal", "code_key",
               "replay_checked")


class CodeKeyRows:
    """Store methods of schema 3 (see the module doc)."""

    # what these methods use of the Store they are mixed into
    _cols: Any
    _read: Any
    _write: Any
    winners: Any
    schema_version: Any

    def prune_where(self, drop: Callable[[Trial | Winner], bool], *, dry_run: bool = False) -> dict[str, int]:
        """Delete the trials and winners for which `drop(record)` is true (a family's judgement, such
        as a stale code key, that SQL cannot make); the counts per table, nothing deleted on dry_run."""
        tq = (select(TrialRow.id, *self._cols(TrialRow, _TRIAL_COLS), TacticRow.params_json)
              .outerjoin(TacticRow, TacticRow.id == TrialRow.tactic_id))
        ids = [r.id for r in self._read(lambda s: s.execute(tq).all())
               if drop(Trial(params_json=r.params_json or "", **{c: getattr(r, c) for c in _TRIAL_COLS}))]
        keys = [(w.problem_key, w.bucket, w.device_key) for w in self.winners() if drop(w)]
        if not dry_run and (ids or keys):
            pk = tuple_(WinnerRow.problem_key, WinnerRow.bucket, WinnerRow.device_key)

            def go(s: Session) -> None:
                for i in range(0, len(ids), 500):          # bounded statements (SQLite's variable limit)
                    s.execute(delete(TrialRow).where(TrialRow.id.in_(ids[i:i + 500])))
                for i in range(0, len(keys), 200):
                    s.execute(delete(WinnerRow).where(pk.in_(keys[i:i + 200])))
            self._write(go)
        return {"trials": len(ids), "winners": len(keys)}

    # -- compiler figures (schema 3)
    def compiler_figure(self, compiler: str, arch: str, w_fmt: str, tactic_id: str,
                        code: str) -> tuple[int | None, int | None, str | None] | None:
        """(shared bytes, tmem columns, error) the compiler gave this config, or None when never
        asked (or the file predates the table)."""
        if self.schema_version < _CODE_KEYS:
            return None
        row = self._read(lambda s: s.get(CompilerFigureRow, (compiler, arch, w_fmt, tactic_id, code)))
        return (row.shared, row.tmem, row.error) if row is not None else None

    def put_compiler_figure(self, compiler: str, arch: str, w_fmt: str, tactic_id: str, code: str,
                            shared: int | None, tmem: int | None, error: str | None = None) -> None:
        row = {"compiler": compiler, "arch": arch, "w_fmt": w_fmt, "tactic_id": tactic_id, "code": code,
               "shared": shared, "tmem": tmem, "error": error}
        self._write(lambda s: upsert(s, CompilerFigureRow, row, ["compiler", "arch", "w_fmt", "tactic_id", "code"]))

