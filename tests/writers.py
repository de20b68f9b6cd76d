"""Concurrent cache writers (tests/test_workers.py on SQLite, tests/test_postgres.py on PostgreSQL).

A module of its own, importing only the cache and the record types (no torch): each writer is a
spawned process, which imports the module its target lives in before it writes anything."""
from __future__ import annotations

import multiprocessing as mp

from autotune.cache import Store
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic

DENSE = Problem.dense(256, 512)


def _writer(url: str, w: int, n: int) -> None:
    store = Store(url)
    for i in range(n):
        t = Tactic("torch", dequant_dtype="fp32", chunk_n=w * 1000 + i)
        store.put_trial(Trial(DENSE.key, 1 + i % 4, t.id, t.family, t.to_json(), "dev", "lib", "ok", "",
                              median_us=1.0 + i, reps=3, rel_err=0.0))
        store.put_winner(Winner(DENSE.key, 1000 + w * n + i, "dev", t.id, t.family, t.to_json(), "lib",
                                1.0, t.id, 1.0, 1.0))


def write_concurrently(url: str, n: int, writers: int = 8) -> None:
    """Create the store at `url`, then `writers` spawned processes each write `n` trials and `n`
    winners at once; every one must exit cleanly (no lock error escaped any writer)."""
    Store(url).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w, n)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
