"""Pruning, which spans the tables: rows of unwanted environments (SQL decides) and rows a family's
judgement calls stale (a callable decides, such as a stale code key)."""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from sqlalchemy import and_, delete, func, not_, or_, select, true, tuple_
from sqlalchemy.orm import Session

from autotune.core.records import Trial, Winner

from autotune.cache.schema import DeviceRow, MissRow, TacticRow, TrialRow, WinnerRow
from autotune.cache.tables.trials import Trials, trial_of
from autotune.cache.tables.winners import Winners


class Pruning(Trials, Winners):
    def families(self) -> set[str]:
        """The families named by any stored trial or winner."""
        q = select(TrialRow.family).union(select(WinnerRow.family))
        return {f for (f,) in self._read(lambda s: s.execute(q).all())}

    def prune(self, *, keep_devices: set[str] | None = None, drop_devices: Iterable[str] = (),
              stale: tuple[str, Mapping[str, str | None]] | None = None, drop_misses: bool = False,
              dry_run: bool = False) -> dict[str, int]:
        """Delete trials, winners and misses (and device rows) of unwanted environments; return the
        counts per table ("trials", "winners", "misses", "devices"), deleting nothing on dry_run.

        keep_devices: keep only these device keys; drop_devices: drop these; stale:
        (device_key, {family: wanted lib_key or None}) drops that device's rows whose lib_key is not
        the wanted one of their family (all of a family mapped to None, or missing from the map);
        drop_misses: all misses of the kept devices too."""
        drop_devices = sorted(drop_devices)

        def cond(t):
            parts = []
            if keep_devices is not None:
                parts.append(not_(t.device_key.in_(sorted(keep_devices))))
            if drop_devices:
                parts.append(t.device_key.in_(drop_devices))
            if stale is not None and hasattr(t, "lib_key"):
                dev, want = stale
                parts.append(and_(t.device_key == dev, t.family.not_in(sorted(f for f, k in want.items() if k))))
                parts += [and_(t.device_key == dev, t.family == f, t.lib_key != k) for f, k in want.items() if k]
            if drop_misses and t is MissRow:
                parts.append(true())
            return or_(*parts) if parts else None
        plan = {"trials": (TrialRow, cond(TrialRow)), "winners": (WinnerRow, cond(WinnerRow)),
                "misses": (MissRow, cond(MissRow)), "devices": (DeviceRow, None)}
        if keep_devices is not None or drop_devices:
            plan["devices"] = (DeviceRow, cond(DeviceRow))
        counts = {name: 0 if c is None else self._read(
            lambda s, t=t, c=c: s.execute(select(func.count()).select_from(t).where(c)).scalar())
            for name, (t, c) in plan.items()}
        if not dry_run and any(counts.values()):
            self._write(lambda s: [s.execute(delete(t).where(c)) for t, c in plan.values() if c is not None])
        return counts

    def prune_where(self, drop: Callable[[Trial | Winner], bool], *, dry_run: bool = False) -> dict[str, int]:
        """Delete the trials and winners for which `drop(record)` is true (a family's judgement, such
        as a stale code key, that SQL cannot make); the counts per table, nothing deleted on dry_run."""
        tq = self._trial_select(TrialRow.id).outerjoin(TacticRow, TacticRow.id == TrialRow.tactic_id)
        ids = [r.id for r in self._read(lambda s: s.execute(tq).all()) if drop(trial_of(r, r.params_json))]
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
