"""Misses: recording the counted ones (MissRecorder) and turning them into search input (what
`autotune search --from-misses` tunes)."""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Iterable, Mapping

from autotune.core import settings
from autotune.core.problem import Problem, check_m
from autotune.core.records import Miss
from autotune.cache import Store

log = logging.getLogger("autotune.runtime.dispatch")


def search_input_from_misses(misses: Iterable[Miss], device_key: str,
                             problem_keys: set[str] | None = None) -> tuple[list[Problem], tuple[int, ...], int]:
    """What `autotune search --from-misses` tunes: the missed problems of this device (optionally
    only those in problem_keys) and the M values they were called with, as buckets. Engines call
    every layer with the same M per forward, so one shared bucket set is (nearly) exact.
    Returns (problems, buckets, rows skipped because their problem key does not parse)."""
    problems: dict[str, Problem] = {}
    ms: set[int] = set()
    bad = 0
    for m in misses:
        if m.device_key != device_key or (problem_keys is not None and m.problem_key not in problem_keys):
            continue
        try:
            p = problems.get(m.problem_key) or Problem.from_key(m.problem_key)
            check_m(m.m)
        except (ValueError, TypeError):
            bad += 1
            continue
        problems[m.problem_key] = p
        ms.add(m.m)
    return sorted(problems.values(), key=lambda p: p.key), tuple(sorted(ms)), bad


class MissRecorder:
    """Where counted misses go and what was written already: `flush(counts)` writes the (problem
    key, M) counts grown since the last flush. Best effort: never raises (a serving process must
    not die at exit over a log).

    to: "memory" (nowhere), a path/URL of a writable cache, or None = $AUTOTUNE_MISSES, else the
    served cache itself if it is writable, else memory."""

    def __init__(self, device_key: str, *, record: bool = True, to: Any = None, cache: Any = None,
                 cache_url: str | None = None, cache_writable: bool = False):
        self.device_key, self.record, self.to = device_key, record, to
        self.cache, self.cache_url, self.cache_writable = cache, cache_url, cache_writable
        self.flushed: dict[tuple[str, int], int] = {}

    def store(self) -> Any:
        """The store misses go to, or None (memory)."""
        target = self.to if self.to is not None else settings.misses_url()
        if target == "memory":
            return None
        if target is None:
            if hasattr(self.cache, "record_misses") and not getattr(self.cache, "readonly", False):
                return self.cache
            if not self.cache_writable or self.cache_url is None:
                return None            # a read-only image: misses stay in memory (Dispatcher.misses)
            target = self.cache_url
        if hasattr(target, "record_misses"):
            return target
        Store.check_writable(target)
        return Store(target)

    def flush(self, now: Counter) -> int:
        """Write what grew since the last flush; returns how many (problem, M) rows."""
        if not self.record:
            return 0
        delta = {k: n - self.flushed.get(k, 0) for k, n in now.items() if n > self.flushed.get(k, 0)}
        if not delta:
            return 0
        try:
            store = self.store()
            if store is None:
                return 0
            store.record_misses(Miss(pk, m, self.device_key, c) for (pk, m), c in delta.items())
            self.flushed.update({k: now[k] for k in delta})
            return len(delta)
        except Exception as e:  # noqa: BLE001
            log.debug("could not record misses: %s", e)
            return 0


def counted(tables: Mapping[Problem, Any]) -> Counter:
    """(problem key, M) -> calls the tables answered from their default rung."""
    return Counter({(p.key, m): n for p, t in tables.items() for m, n in t.misses.items()})


def flush_at_exit(recorder: MissRecorder, tables: Mapping[Problem, Any]) -> None:
    """The dispatcher's finalizer (at exit, or when it is collected): it holds the recorder and the
    tables, never the dispatcher, so module state keeps no dispatcher alive."""
    recorder.flush(counted(tables))
