"""Winners: the chosen tactic per (problem, bucket, device), with the device and library rows an
import brings along."""
from __future__ import annotations

from typing import Iterable, Mapping

from sqlalchemy.orm import Session

from autotune.core.records import Winner
from autotune.core.tactic import canonical_json

from autotune.cache.columns import WINNER, WINNER_KEY, from_row, to_row
from autotune.cache.schema import DeviceRow, LibsetRow, TacticRow, WinnerRow, utcnow
from autotune.cache.tables.db import Db, put_problem_key, tactic_row
from autotune.cache.upsert import upsert
from sqlalchemy import select



class Winners(Db):
    def put_winner(self, w: Winner) -> None:
        self._write(lambda s: self._put_winner(s, w))

    def _put_winner(self, s: Session, w: Winner) -> None:
        if w.predicted:     # a prediction never replaces a measured winner (a measured one replaces it)
            held = s.execute(select(WinnerRow.predicted).where(
                WinnerRow.problem_key == w.problem_key, WinnerRow.bucket == w.bucket,
                WinnerRow.device_key == w.device_key)).first()
            if held is not None and not held[0]:
                return
        upsert(s, TacticRow, tactic_row(w.params_json, w.tactic_id), ["id"], "ignore")
        put_problem_key(s, w.problem_key)
        row = to_row(w, WINNER)
        row["updated_at"] = utcnow()
        upsert(s, WinnerRow, row, list(WINNER_KEY))

    def winners(self, device_key: str | None = None) -> list[Winner]:
        """Every stored winner, as stored: no row is dropped here (a missing tactic row gives
        params_json ""), so each reader counts what it skips by autotune.cache.rows.check_winner."""
        q = (select(*self._cols(WinnerRow, WINNER), TacticRow.params_json)
             .outerjoin(TacticRow, TacticRow.id == WinnerRow.tactic_id))
        if device_key is not None:
            q = q.where(WinnerRow.device_key == device_key)
        q = q.order_by(WinnerRow.device_key, WinnerRow.problem_key, WinnerRow.bucket)
        return [Winner(params_json=r.params_json or "", **from_row(r, WINNER))
                for r in self._read(lambda s: s.execute(q).all())]

    def put_winners(self, winners: Iterable[Winner], devices: Iterable[dict] = (),
                    libsets: Mapping[str, dict] | None = None) -> None:
        """Winners with the device records ({"device_key", "gpu_name", "cc", "sm_count", ...}) and
        libsets ({lib_key: versions}) they refer to, in one transaction (an import: all or nothing).
        A device or libset already stored is kept; a winner replaces the stored one of its
        (problem, bucket, device). Check rows first (autotune.cache.rows): nothing is validated here."""
        winners, devices = list(winners), list(devices)

        def go(s: Session) -> None:
            for rec in devices:
                row = {"device_key": rec["device_key"], "gpu_name": rec["gpu_name"], "cc": rec["cc"],
                       "sm_count": rec["sm_count"], "record_json": canonical_json(rec)}
                upsert(s, DeviceRow, row, ["device_key"], "ignore")
            for key, versions in (libsets or {}).items():
                upsert(s, LibsetRow, {"lib_key": key, "versions_json": canonical_json(versions)}, ["lib_key"], "ignore")
            for w in winners:
                self._put_winner(s, w)
        if winners or devices or libsets:
            self._write(go)

    def delete_winner(self, problem_key: str, bucket: int, device_key: str) -> None:
        t = WinnerRow.__table__
        self._write(lambda s: s.execute(t.delete().where(
            t.c.problem_key == problem_key, t.c.bucket == bucket, t.c.device_key == device_key)))
