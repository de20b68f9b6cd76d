"""Labelled rows for the ranking model, read from a store's trials (the committed cache or a user's).

One group per (problem, bucket, device): every tactic timed there (ok, or dropped by successive
halving with the time that dropped it), every tactic that failed there or at bucket 0 (compile
failures) and every statically rejected one (bucket 0) as negatives. Trials under several library
versions of one device are grouped together (the model's key lists every version it saw).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from autotune.core.arch import ARCHS, Arch, arch_for_cc
from autotune.core.problem import Problem
from autotune.core.records import Trial
from autotune.core.tactic import Tactic
from autotune.engine import rankmodel
from autotune.tactics import registry

ALL_BUCKETS = 0


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


def groups(store, device_key: str | None = None) -> list[Group]:
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
                                                                    t.device_key)
        _add(g, t)
    for g in by.values():
        for t in bucket0[(g.problem.key, g.device_key)]:
            if t.status in ("failed", "rejected") and t.tactic_id not in g.timed:
                _add(g, t)
    return [g for _, g in sorted(by.items()) if g.timed]


def _add(g: Group, t: Trial) -> None:
    g.tactics[t.tactic_id] = Tactic.from_json(t.params_json)
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


def train(store, device_key: str, groups_: list[Group] | None = None, rounds: int = rankmodel.ROUNDS,
          memo: dict | None = None) -> rankmodel.Model:
    """Fit a model on one device's groups of `store` (or the given subset, for held-out evaluation;
    `memo` keeps each group's rows between folds)."""
    arch, sms, rec = device_arch(store, device_key)
    gs = groups(store, device_key) if groups_ is None else groups_
    if not gs:
        raise ValueError(f"no timed trials for device {device_key} in the store: nothing to learn from")
    memo = {} if memo is None else memo
    X, y = [], []
    for g in gs:
        key = (g.problem.key, g.bucket, g.device_key)
        if key not in memo:
            memo[key] = rows(g, arch, sms)
        _, f, lab = memo[key]
        X += f
        y += lab
    key = {"arch": arch.name, "gpu": rec.get("gpu_name"), "sms": sms, "device_key": device_key,
           "libs": {k: v for k, v in (rec.get("libs") or {}).items() if v}}
    info = {"rows": len(X), "groups": len(gs), "problems": sorted({g.problem.key for g in gs})}
    return rankmodel.fit(X, y, key, info, rounds)
