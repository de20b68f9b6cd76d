"""The serving policy as data: which tactic is forced where (pins), whether a problem must serve
one batch-invariant tactic for every M, and whether bound layers keep one copy of the weight.

`invariant_pick` is batch-invariant mode's rule: the stored winners' one tactic when they name
one invariant tactic; else the invariant winner covering the most buckets (noted: per-M tuning is
lost); else the designated default if invariant; with none, (None, why) and the problem is refused
with that one line — never a silent mix of tactics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.core import settings
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, parse_tactic
from autotune.runtime.pins import parse_pins


@dataclass
class ServingPolicy:
    """pins: {problem key or "*": tactic} (`*`: every problem whose kind the tactic fits);
    batch_invariant: one invariant tactic per problem for every M; one_copy: what `bind` does
    unless told (autotune.runtime.onecopy); one_copy_upto: one-copy bindings choose their layout
    by the rungs up to this M."""

    pins: dict[str, Tactic] = field(default_factory=dict)
    batch_invariant: bool = False
    one_copy: bool = False
    one_copy_upto: int | None = None

    def __post_init__(self) -> None:
        u = self.one_copy_upto
        if u is not None and (isinstance(u, bool) or not isinstance(u, int) or u < 1):
            raise ValueError(f"one_copy_upto must be a positive int M or None, not {u!r}")

    @classmethod
    def from_settings(cls, pins: dict[str, Any] | None = None, batch_invariant: bool | None = None,
                      one_copy: bool = False, one_copy_upto: int | None = None) -> "ServingPolicy":
        """$AUTOTUNE_PIN, then `pins` over it; $AUTOTUNE_BATCH_INVARIANT (or vLLM's) unless given."""
        merged = {k: parse_tactic(t) for k, t in {**parse_pins(settings.pins()), **(pins or {})}.items()}
        invariant = settings.batch_invariant() if batch_invariant is None else bool(batch_invariant)
        return cls(merged, invariant, one_copy, one_copy_upto)

    def pin_for(self, problem: Problem) -> tuple[Tactic | None, bool]:
        """(the pinned tactic, explicit): the problem's own pin (must fit), else `*` (skipped
        where it does not fit), else (None, False)."""
        if problem.key in self.pins:
            return self.pins[problem.key], True
        return self.pins.get("*"), False

    def explicit(self) -> list[Problem]:
        """The problems pinned by key (their tables are installed at start)."""
        return [Problem.from_key(k) for k in self.pins if k != "*"]


def invariant_pick(p: Problem, items: list[tuple[int, Tactic]], default: Tactic,
                   invariant: Callable[[Problem, Tactic], bool], arch_name: str) -> tuple[Tactic | None, str]:
    """(the one tactic for every M, a note when it is not simply the stored one) or (None, why)."""
    ok = [x for _, x in items if invariant(p, x)]
    if ok and len({x for _, x in items}) == 1:
        return ok[0], ""
    if ok:
        pick = max(set(ok), key=lambda x: (ok.count(x), x.id))
        return pick, (f"the stored winners name {len({x for _, x in items})} tactics; serving {pick} for every M "
                      f"(the winner of {ok.count(pick)} of {len(items)} buckets): `autotune search "
                      "--batch-invariant` tunes one tactic for every M")
    if invariant(p, default):
        return default, (f"no stored winner is batch-invariant; serving the designated default {default} for every M"
                         if items else "")
    return None, (f"{p.key}: no batch-invariant tactic (stored winners: {len(items)}; the designated default "
                  f"{default} is not batch-invariant on {arch_name}); run `autotune search --batch-invariant` "
                  "or turn batch-invariant mode off")
