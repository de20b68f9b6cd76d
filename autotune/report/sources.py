"""Several caches read as one, for a report of searches stored apart (e.g. the dense problems in
one cache, the MoE problems in another).

Only the reads `collect` makes. Rows are keyed as in the cache; where two caches hold the same key
(a winner of one (problem, bucket, device), a trial of one (problem, bucket, tactic, device, lib
set), a meta key), the cache given later wins — as `autotune cache merge` does — and `notes` says
how many rows each cache replaced. Misses of one (problem, M, device) add up.
"""
from __future__ import annotations

from dataclasses import replace


class StoreUnion:
    def __init__(self, stores: list):
        if not stores:
            raise ValueError("no cache to read")
        self.stores = list(stores)
        self.url = " + ".join(s.url for s in self.stores)
        self.notes: list[str] = []
        w, self._winners = self._merge("winners", lambda r: (r.problem_key, r.bucket, r.device_key))
        t, self._trials = self._merge("trials", lambda r: (r.problem_key, r.bucket, r.tactic_id, r.device_key,
                                                           r.lib_key))
        self.notes += [n for n in (w, t) if n]

    def _merge(self, what: str, key) -> tuple[str, list]:
        rows: dict = {}
        replaced = []
        for s in self.stores:
            got = getattr(s, what)()
            n = sum(1 for r in got if key(r) in rows)
            rows.update((key(r), r) for r in got)
            replaced.append(n)
        if not any(replaced):
            return "", list(rows.values())
        said = ", ".join(f"{s.url} replaced {n}" for s, n in zip(self.stores, replaced) if n)
        return f"{what} read from {len(self.stores)} caches, a later one winning on the same key: {said}", \
            list(rows.values())

    def winners(self):
        return list(self._winners)

    def trials(self):
        return list(self._trials)

    def misses(self):
        out: dict = {}
        for s in self.stores:
            for m in s.misses():
                k = (m.problem_key, m.m, m.device_key)
                out[k] = replace(m, count=out[k].count + m.count) if k in out else m
        return list(out.values())

    def meta(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.stores:
            out.update(s.meta())
        return out

    def device_records(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for s in self.stores:
            out.update(s.device_records())
        return out

    def problems(self):
        seen = {}
        for s in self.stores:
            for p in s.problems():
                seen.setdefault(p.key, p)
        return sorted(seen.values())

    def _first(self, method: str, key):
        for s in reversed(self.stores):
            v = getattr(s, method)(key)
            if v is not None:
                return v
        return None

    def tactic(self, tactic_id: str):
        return self._first("tactic", tactic_id)

    def libset(self, lib_key: str):
        return self._first("libset", lib_key)

    def device(self, device_key: str):
        return self._first("device", device_key)

    def close(self) -> None:
        for s in self.stores:
            s.close()
