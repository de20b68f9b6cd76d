"""Spawned claimers for tests/test_claims.py and tests/test_postgres.py: a module that imports the
cache only (no torch), so that starting many processes stays cheap."""
from __future__ import annotations

import multiprocessing as mp

from autotune.cache import Store
from autotune.cache.claims import Claims, JobKey

PROBLEM = "dense:bf16*nvfp4->bf16:n256:k512"   # Problem.dense(256, 512).key


def _race(url: str, owner: str, keys: int, start, out) -> None:
    store = Store(url)
    c = Claims(store, owner)
    start.wait()
    out.put((owner, [i for i in range(keys) if c.claim(JobKey.of(PROBLEM, i + 1, "dev", ["lib"]), 600).won]))
    store.close()


def race_claimers(url: str, procs: int = 6, keys: int = 30) -> dict[int, list[str]]:
    """`procs` spawned processes claim the same `keys` jobs at once; job -> the owners that won it."""
    Store(url).close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_race, args=(url, f"racer{i}:{i}:x", keys, start, out)) for i in range(procs)]
    for p in ps:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(60)
    assert [p.exitcode for p in ps] == [0] * procs
    won: dict[int, list[str]] = {i: [] for i in range(keys)}
    for owner, ks in results:
        for k in ks:
            won[k].append(owner)
    return won
