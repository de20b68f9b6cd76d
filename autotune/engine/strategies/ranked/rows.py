"""Labelled rows for the ranking model, read from a store's trials (the committed cache or a user's).

One group per (problem, bucket, device): every tactic timed there (ok, or dropped by successive
halving with the time that dropped it), every tactic that failed there or at bucket 0 (compile
failures) and every statically rejected one (bucket 0) as negatives. Trials under several library
versions of one device are grouped together (the model's key lists every version it saw).

A model may be fitted on several stores of one arch (`train_many`: the committed H200 searches of
different days, each with its own families and problems). Each store's groups stay its own: a
label is relative to the best time of that run, so timings of two runs are never compared.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

from autotune.core.arch import ARCHS, Arch, arch_for_cc
from autotune.core.problem import Problem
from autotune.core.records import Trial
from autotune.core.tactic import Tactic
from autotune.engine.strategies.ranked import model as rankmodel
from autotune.tactics import registry

ALL_BUCKETS = 0
#: per (problem, bucket), the fastest tactic of at most this many sources goes into a model's info
BESTS = 2


@dataclass
class Group:
    """The trials of one (problem, bucket, device): tactic id -> its best-known record."""

    problem: Problem
    bucket: int
    device_key: str
    timed: dict[str, float] = field(default_factory=dict)        # tactic id -> stored median_us
    negative: set[str] = field(default_factory=set)              # failed or rejected tactic ids
    tactics: dict[str, Tactic] = field(default_factory=dict)
    smem: dict[str, int | None] = field(default_factory=dict)
    ok: set[str] = field(default_factory=set)                    # reached a final (status ok)
    rejected: set[str] = field(default_factory=set)              # statically rejected (never a candidate)
    source: str = ""                                             # which store (train_many)
    lib_keys: set[str] = field(default_factory=set)              # library sets of its trials

    @property
    def key(self) -> tuple[str, str, int, str]:
        """Identity across stores (memo key): two stores may hold the same (problem, bucket, device)."""
        return (self.source, self.problem.key, self.bucket, self.device_key)

    @property
    def best_us(self) -> float:
        return min(self.timed.values())


def device_arch(store, device_key: str) -> tuple[Arch, int, dict]:
    """(arch, SM count, device record) of a stored device."""
    d = store.device(device_key) or {}
    cc = str(d.get("cc") or "cpu")
    if d.get("device") == "cpu" or cc == "cpu":
        return ARCHS["cpu"], int(d.get("sm_count") or 0), d
    major, _, minor = cc.partition(".")
    arch = arch_for_cc(int(major), int(minor or 0))
    return arch, int(d.get("sm_count") or 0), d


class Source(NamedTuple):
    """One store's trials of one device, under a name (the model's info lists it)."""

    store: Any                # an autotune.cache.Store
    device_key: str
    name: str = ""


def groups(store, device_key: str | None = None, source: str = "") -> list[Group]:
    """Every (problem, bucket) of the store (one device, or all) with at least one timed tactic."""
    by: dict[tuple, Group] = {}
    bucket0: dict[tuple, list[Trial]] = defaultdict(list)
    for t in store.trials(device_key):
        if not t.params_json:
            continue            # a trial whose tactic row is missing: nothing to describe it by
        if t.bucket == ALL_BUCKETS:
            bucket0[(t.problem_key, t.device_key)].append(t)
            continue
        g = by.get((t.problem_key, t.bucket, t.device_key))
        if g is None:
            g = by[(t.problem_key, t.bucket, t.device_key)] = Group(Problem.from_key(t.problem_key), t.bucket,
                                                                    t.device_key, source=source)
        _add(g, t)
    for g in by.values():
        for t in bucket0[(g.problem.key, g.device_key)]:
            if t.status in ("failed", "rejected") and t.tactic_id not in g.timed:
                _add(g, t)
    return [g for _, g in sorted(by.items()) if g.timed]


def _add(g: Group, t: Trial) -> None:
    g.tactics[t.tactic_id] = Tactic.from_json(t.params_json)
    g.lib_keys.add(t.lib_key)
    g.smem[t.tactic_id] = t.smem_model
    if t.status in ("ok", "dropped") and t.median_us is not None and t.median_us > 0:
        g.timed[t.tactic_id] = t.median_us
        g.negative.discard(t.tactic_id)
        if t.status == "ok":
            g.ok.add(t.tactic_id)
    elif t.status in ("failed", "rejected"):
        g.negative.add(t.tactic_id)
        if t.status == "rejected":
            g.rejected.add(t.tactic_id)


def space_ids(problem: Problem, family: str, arch: Arch, memo: dict | None = None) -> frozenset[str]:
    """The ids of `family`'s tactics for `problem` on `arch` as the installed code enumerates them
    (the current space); empty where the family is unknown here or does not support the problem."""
    key = (problem.key, family, arch.name)
    if memo is not None and key in memo:
        return memo[key]
    try:
        fam = registry.get(family)
        ids = frozenset() if fam.supports(problem) else frozenset(t.id for t in fam.enumerate(problem, arch))
    except (ValueError, ImportError):
        ids = frozenset()
    if memo is not None:
        memo[key] = ids
    return ids


def in_space(gs: Sequence[Group], arch: Arch, memo: dict | None = None) -> tuple[list[Group], int]:
    """The groups less every tactic whose parameters the current space no longer holds (a member or
    a parameter renamed, removed or narrowed since the trials were stored), and how many (group,
    tactic) rows that removed; a group left with no timed tactic is dropped. Stored trials of such a
    tactic would teach the model about a tactic no search can run."""
    memo = {} if memo is None else memo
    out, dropped = [], 0
    for g in gs:
        gone = {i for i, t in g.tactics.items() if i not in space_ids(g.problem, t.family, arch, memo)}
        if gone:
            dropped += len(gone)
            g = Group(g.problem, g.bucket, g.device_key,
                      {i: v for i, v in g.timed.items() if i not in gone}, g.negative - gone,
                      {i: v for i, v in g.tactics.items() if i not in gone},
                      {i: v for i, v in g.smem.items() if i not in gone}, g.ok - gone, g.rejected - gone,
                      g.source, set(g.lib_keys))
        if g.timed:
            out.append(g)
    return out, dropped


def row(problem: Problem, tactic: Tactic, m: int, arch: Arch, sms: int, smem: int | None) -> dict[str, float]:
    """The model's features for one tactic (figures from the tactic's own family, {} if unknown)."""
    try:
        figs = registry.get(tactic.family).figures(problem, tactic, m, sms)
    except (ValueError, ImportError):
        figs = {}
    return rankmodel.features(problem, tactic, m, arch, sms, smem, figs)


def rows(g: Group, arch: Arch, sms: int) -> tuple[list[str], list[dict], list[float]]:
    """(tactic ids, feature rows, labels) of one group."""
    ids = sorted(g.tactics)
    best = g.best_us
    feats = [row(g.problem, g.tactics[i], g.bucket, arch, sms, g.smem.get(i)) for i in ids]
    labels = [rankmodel.label(g.timed.get(i), best) for i in ids]
    return ids, feats, labels


def bests(gs: Sequence[Group], order: Sequence[str]) -> dict[str, list[str]]:
    """Per (problem, bucket), `rankmodel.best_key`: the fastest tactic of each source that timed it
    (among its final-round times where it has them), the sources taken in reverse `order` (the
    newest, listed last, first), at most BESTS ids. Only the given groups: a held-out fold's
    (problem, bucket) has none."""
    rank = {name: i for i, name in enumerate(order)}
    per: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for g in gs:
        pool = {i: us for i, us in g.timed.items() if i in g.ok} or g.timed
        fastest = min(pool, key=lambda i: (pool[i], i))
        per[rankmodel.best_key(g.problem.key, g.bucket)].append((-rank.get(g.source, -1), fastest))
    out = {}
    for k, pairs in sorted(per.items()):
        ids = list(dict.fromkeys(i for _, i in sorted(pairs)))
        out[k] = ids[:BESTS]
    return out


def train(store, device_key: str, groups_: list[Group] | None = None, rounds: int = rankmodel.ROUNDS,
          memo: dict | None = None) -> rankmodel.Model:
    """Fit a model on one device's groups of `store` (or the given subset, for held-out evaluation;
    `memo` keeps each group's rows between folds)."""
    return train_many([Source(store, device_key)], groups_, rounds, memo)


def source_groups(sources: Sequence[Source]) -> list[Group]:
    """The groups of every source, each tagged with its source's name (or its index)."""
    return [g for i, s in enumerate(sources) for g in groups(s.store, s.device_key, s.name or str(i))]


def train_many(sources: Sequence[Source], groups_: list[Group] | None = None, rounds: int = rankmodel.ROUNDS,
               memo: dict | None = None) -> rankmodel.Model:
    """Fit one model on the groups of several sources of one arch (or the given subset of
    `source_groups(sources)`). The key lists every GPU, SM count and library version the trials
    were measured under."""
    if not sources:
        raise ValueError("no store to learn from")
    dev = {(s.name or str(i)): (s, *device_arch(s.store, s.device_key)) for i, s in enumerate(sources)}
    arches = sorted({a.name for _, a, _, _ in dev.values()})
    if len(arches) != 1:
        raise ValueError(f"one rank model is for one arch; the stores hold {', '.join(arches)}")
    gs = source_groups(sources) if groups_ is None else groups_
    if not gs:
        raise ValueError(f"no timed trials for device {', '.join(sorted({s.device_key for s in sources}))} "
                         "in the store: nothing to learn from")
    memo = {} if memo is None else memo
    X, y = [], []
    for g in gs:
        if g.key not in memo:
            _, arch, sms, _ = dev[g.source]
            memo[g.key] = rows(g, arch, sms)
        _, f, lab = memo[g.key]
        X += f
        y += lab
    libs: dict[str, set[str]] = {}
    for g in gs:
        for lk in g.lib_keys:
            for name, v in (dev[g.source][0].store.libset(lk) or {}).items():
                if v:
                    libs.setdefault(name, set()).add(str(v))
    one = lambda vs: vs[0] if len(vs) == 1 else vs      # noqa: E731  (a list only where they differ)
    key = {"arch": arches[0], "gpu": one(sorted({str(r.get("gpu_name")) for *_, r in dev.values()})),
           "sms": one(sorted({sms for _, _, sms, _ in dev.values()})),
           "device_key": one(sorted({s.device_key for s, *_ in dev.values()})),
           "libs": {k: ",".join(sorted(v)) for k, v in sorted(libs.items())}}
    info = {"rows": len(X), "groups": len(gs), "problems": sorted({g.problem.key for g in gs}),
            "bests": bests(gs, list(dev))}
    if len(sources) > 1:
        info["sources"] = {name: sum(g.source == name for g in gs) for name in dev}
    return rankmodel.fit(X, y, key, info, rounds)
