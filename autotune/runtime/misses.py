"""Misses -> search input: what `autotune search --from-misses` tunes."""
from __future__ import annotations

from typing import Iterable

from autotune.core.problem import Problem, check_m
from autotune.core.records import Miss


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


