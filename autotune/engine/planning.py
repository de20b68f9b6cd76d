"""The static pass of a search: every tactic of every family with its verdict (nothing compiles
here), and the per-family counts the search prints (kept, rejected and why, unknown and why)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import Family


@dataclass(frozen=True)
class Planned:
    problem: Problem
    tactic: Tactic
    verdict: Verdict


@dataclass
class FamilyPlan:
    family: str
    kept: int = 0
    rejected: int = 0
    unknown: int = 0
    skipped: int = 0       # passed the verdict but not measured: the family cannot run on this device
    unsampled: int = 0     # passed the verdict but left out of the max_tactics sample
    reasons: Counter = field(default_factory=Counter)      # reason class -> count
    examples: dict = field(default_factory=dict)           # reason class -> one full reason
    unknown_reasons: Counter = field(default_factory=Counter)   # why verdicts stayed unknown: class -> count
    unknown_examples: dict = field(default_factory=dict)

    def line(self) -> str:
        s = f"{self.family}: {self.kept} kept, {self.rejected} rejected"
        if self.unknown:
            s += f", {self.unknown} unknown until checked on the device"
            if self.unknown_reasons:
                s += " (" + "; ".join(f"{n}× " + ("e.g. " if n > 1 and r != self.unknown_examples[r] else "")
                                      + self.unknown_examples[r] for r, n in self.unknown_reasons.most_common()) + ")"
        if self.skipped:
            s += f", {self.skipped} not measured (family skipped on this device)"
        if self.unsampled:
            s += f", {self.unsampled} not measured (outside the --max-tactics sample)"
        if self.reasons:
            s += ": " + "; ".join(f"{n}× " + ("e.g. " if n > 1 and r != self.examples[r] else "") + self.examples[r]
                                  for r, n in self.reasons.most_common())
        return s


def _reason_class(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def plan(problems: Iterable[Problem], families: Sequence[Family], arch: Arch) -> dict[Problem, list[Planned]]:
    """Static pass: every tactic of every family with its verdict. Nothing compiles here."""
    out: dict[Problem, list[Planned]] = {}
    for p in problems:
        rows = []
        for fam in families:
            for t in fam.enumerate(p, arch):
                rows.append(Planned(p, t, fam.verdict(p, t, arch)))
        out[p] = rows
    return out


def summarize(planned: dict[Problem, list[Planned]]) -> dict[str, list[FamilyPlan]]:
    out: dict[str, list[FamilyPlan]] = {}
    for p, rows in planned.items():
        by_fam: dict[str, FamilyPlan] = {}
        for r in rows:
            fp = by_fam.setdefault(r.tactic.family, FamilyPlan(r.tactic.family))
            if r.verdict.ok is True:
                fp.kept += 1
            elif r.verdict.ok is None:
                fp.unknown += 1
                c = _reason_class(r.verdict.reason)
                fp.unknown_reasons[c] += 1
                fp.unknown_examples.setdefault(c, r.verdict.reason)
            else:
                fp.rejected += 1
                c = _reason_class(r.verdict.reason)
                fp.reasons[c] += 1
                fp.examples.setdefault(c, r.verdict.reason)
        out[p.key] = list(by_fam.values())
    return out


