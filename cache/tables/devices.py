"""The rows every trial and winner refers to: devices (and the environment a search records), library
sets, problems and tactics."""
from __future__ import annotations

from sqlalchemy import select

from autotune.core.env import Env
from autotune.core.layer import parse_key
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, canonical_json

from autotune.cache.schema import DeviceRow, LibsetRow, ProblemRow, TacticRow
from autotune.cache.tables.db import Db, problem_row, row_json
from autotune.cache.upsert import upsert


class Devices(Db):
    # -- environment
    def put_environment(self, env: Env, depends_on: tuple[str, ...]) -> None:
        dev = {"device_key": env.device_key, "gpu_name": env.gpu_name, "cc": env.cc, "sm_count": env.sm_count,
               "record_json": canonical_json(env.to_dict())}
        lib = {"lib_key": env.lib_key(depends_on), "versions_json": canonical_json(env.lib_versions(depends_on))}
        self._write(lambda s: (upsert(s, DeviceRow, dev, ["device_key"]),
                               upsert(s, LibsetRow, lib, ["lib_key"], "ignore")))

    def device(self, device_key: str) -> dict | None:
        row = self._read(lambda s: s.get(DeviceRow, device_key))
        return row_json(row.record_json) if row else None

    def devices(self) -> list[dict]:
        rows = self._read(lambda s: s.scalars(select(DeviceRow).order_by(DeviceRow.device_key)).all())
        return [row_json(r.record_json) for r in rows]

    def device_records(self) -> dict[str, dict]:
        """Device records by key; a damaged record (not JSON, or naming another key) is left out."""
        rows = self._read(lambda s: s.execute(select(DeviceRow.device_key, DeviceRow.record_json)).all())
        out = {}
        for key, rec in rows:
            try:
                d = row_json(rec)
            except (TypeError, ValueError):
                continue
            if isinstance(d, dict) and d.get("device_key") == key:
                out[key] = d
        return out

    def libset(self, lib_key: str) -> dict | None:
        row = self._read(lambda s: s.get(LibsetRow, lib_key))
        return row_json(row.versions_json) if row else None

    # -- problems, tactics
    def put_problem(self, problem: Problem) -> None:
        self._write(lambda s: upsert(s, ProblemRow, problem_row(problem), ["key"], "ignore"))

    def put_tactic(self, tactic: Tactic) -> None:
        row = {"id": tactic.id, "family": tactic.family, "params_json": tactic.to_json()}
        self._write(lambda s: upsert(s, TacticRow, row, ["id"], "ignore"))

    def tactic(self, tactic_id: str) -> Tactic | None:
        row = self._read(lambda s: s.get(TacticRow, tactic_id))
        return Tactic.from_json(row.params_json) if row else None

    def problems(self) -> list[Problem]:
        """Every stored problem this version can read. The epilogue (`:swiglu` / `:reduce`) is in
        the key only (the row's columns predate it), so problems are read from their keys; a key
        this version does not parse (a newer kind or epilogue) is left out, never misread as the
        plain problem of its columns."""
        rows = self._read(lambda s: s.scalars(select(ProblemRow.key).order_by(ProblemRow.key)).all())
        out = []
        for key in rows:
            try:
                out.append(parse_key(key))
            except ValueError:
                continue
        return out
