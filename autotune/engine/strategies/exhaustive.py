"""`--strategy exhaustive` (or `--exhaustive`): every kept tactic fully timed with the exhaustive
timer, no halving; what halving dropped before is timed again (the reference halving is checked against)."""
from __future__ import annotations

from dataclasses import replace

from autotune.engine.options import SearchOptions
from autotune.engine.strategies.base import HalvingStrategy


class ExhaustiveStrategy(HalvingStrategy):
    name = "exhaustive"

    def configure(self, o: SearchOptions) -> SearchOptions:
        return replace(o, strategy=self.name, halving=replace(o.halving, exhaustive=True))

    def redo(self) -> frozenset[str]:
        return frozenset({"dropped"})
