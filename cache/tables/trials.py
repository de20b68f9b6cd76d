"""Trials (every attempt, keyed by problem, bucket, tactic, device, libraries and code) and the
compiler figures the search keeps per (compiler, arch, format, tactic, member sources)."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from autotune.core.records import Trial

from autotune.cache.columns import TRIAL, TRIAL_KEY, names, to_row
from autotune.cache.schema import CompilerFigureRow, TacticRow, TrialRow, utcnow
from autotune.cache.tables.db import Db, put_problem_key, tactic_row
from autotune.cache.upsert import upsert, upsert_many

#: the schema that added the compiler_figures table; an older file opened read-only has none
_FIGURES_SINCE = 3
_NAMES = names(TRIAL)


def trial_of(r, params_json: str | None) -> Trial:
    """The Trial of a selected row (its columns by name, the tactic's parameters joined)."""
    return Trial(params_json=params_json or "", **{c: getattr(r, c) for c in _NAMES})


class Trials(Db):
    def put_trial(self, trial: Trial) -> None:
        self.put_trials([trial])

    def put_trials(self, trials: Sequence[Trial]) -> None:
        """All in one transaction (a search's static rejections: ~1,200 rows, one commit, not 1,200)."""
        rows = []
        for trial in trials:
            row = to_row(trial, TRIAL)
            row["created_at"] = utcnow()
            rows.append((tactic_row(trial.params_json, trial.tactic_id), trial.problem_key, row))

        def go(s: Session) -> None:
            for pk in dict.fromkeys(pk for _, pk, _ in rows):
                put_problem_key(s, pk)
            upsert_many(s, TacticRow, list({tac["id"]: tac for tac, _, _ in rows}.values()), ["id"], "ignore")
            upsert_many(s, TrialRow, [row for _, _, row in rows], list(TRIAL_KEY))
        if rows:
            self._write(go)

    def _trial_select(self, *extra):
        return select(*extra, *self._cols(TrialRow, TRIAL), TacticRow.params_json)

    def get_trials(self, problem_key: str, bucket: int, device_key: str) -> list[Trial]:
        q = (self._trial_select()
             .join(TacticRow, TacticRow.id == TrialRow.tactic_id)
             .where(TrialRow.problem_key == problem_key, TrialRow.bucket == bucket,
                    TrialRow.device_key == device_key).order_by(TrialRow.id))
        return [trial_of(r, r.params_json) for r in self._read(lambda s: s.execute(q).all())]

    def trials(self, device_key: str | None = None) -> list[Trial]:
        """Every stored trial (of one device, or all), oldest first: for reports. A trial whose
        tactic row is missing comes back with params_json "" (autotune.cache.rows.check_trial names it)."""
        q = self._trial_select().outerjoin(TacticRow, TacticRow.id == TrialRow.tactic_id)
        if device_key is not None:
            q = q.where(TrialRow.device_key == device_key)
        rows = self._read(lambda s: s.execute(q.order_by(TrialRow.id)).all())
        return [trial_of(r, r.params_json) for r in rows]

    def trial_keys(self, device_key: str) -> set[tuple[str, int, str, str]]:
        q = (select(TrialRow.problem_key, TrialRow.bucket, TrialRow.tactic_id, TrialRow.lib_key)
             .where(TrialRow.device_key == device_key))
        return {tuple(r) for r in self._read(lambda s: s.execute(q).all())}

    # -- compiler figures (schema 3)
    def compiler_figure(self, compiler: str, arch: str, w_fmt: str, tactic_id: str,
                        code: str) -> tuple[int | None, int | None, str | None] | None:
        """(shared bytes, tmem columns, error) the compiler gave this config, or None when never
        asked (or the file predates the table)."""
        if self.schema_version < _FIGURES_SINCE:
            return None
        row = self._read(lambda s: s.get(CompilerFigureRow, (compiler, arch, w_fmt, tactic_id, code)))
        return (row.shared, row.tmem, row.error) if row is not None else None

    def put_compiler_figure(self, compiler: str, arch: str, w_fmt: str, tactic_id: str, code: str,
                            shared: int | None, tmem: int | None, error: str | None = None) -> None:
        row = {"compiler": compiler, "arch": arch, "w_fmt": w_fmt, "tactic_id": tactic_id, "code": code,
               "shared": shared, "tmem": tmem, "error": error}
        self._write(lambda s: upsert(s, CompilerFigureRow, row, ["compiler", "arch", "w_fmt", "tactic_id", "code"]))
