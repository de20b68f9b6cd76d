"""FP4MoE's whole-layer route: both GEMMs of the block in one launch at the Ms where the cache holds a
measured one-launch winner for the block's layer problem (autotune.core.layer; searched with
`--moe-layers`), on the packs the block's two bindings already hold (no copy of a weight); the
block's two launchers everywhere else.

A layer problem's search measures, per bucket, the one-launch kernels of the families that run the
kind (`Family.kinds`: the cuda layer kernel) against the pair of the two pair problems' stored
winners (`engine/layers.py`) and the layer family's torch compositions. So an *exact, measured*
winner that is not the layer family's own (`via` pair or torch: the pair is what the block runs
anyway) was faster than the pair at that bucket, and the route serves it there. Nearest and predicted
rungs, and the default, leave the pair: a layer kernel's time at one bucket says nothing about
another's. A batch-invariant dispatcher serves the pair at every M (one tactic per problem). Where the winner's layout is not the one both bindings hold (one copy in another layout,
or pairs served by another family), the pair serves that M and `skipped` says why.

Chosen once per M (FP4MoE keeps it in its per-M form): nothing here runs on the call path.
"""
from __future__ import annotations

from typing import Any

from autotune.core.layer import LayerProblem
from autotune.tactics import registry


class LayerRoute:
    """`for_m(m, bound13, bound2)` → (launcher, w13 pack, w2 pack) or None (the pair serves M)."""

    __slots__ = ("problem", "dispatcher", "device", "_built", "skipped")

    def __init__(self, dispatcher: Any, problem13: Any, problem2: Any, device: str):
        try:
            self.problem: LayerProblem | None = LayerProblem.from_pair(problem13, problem2)
        except ValueError:                   # not one bf16 SwiGLU + reduce layer: no layer problem to serve
            self.problem = None
        if dispatcher.batch_invariant:       # one tactic per problem for every M: the pair's, never a per-M swap
            self.problem = None
        self.dispatcher, self.device = dispatcher, device
        self._built: dict[tuple, Any] = {}
        #: M -> why the pair serves it although the layer problem has a one-launch winner there
        self.skipped: dict[int, str] = {}

    def for_m(self, m: int, bound13: Any, bound2: Any) -> tuple[Any, Any, Any] | None:
        if self.problem is None:
            return None
        try:
            rung, tactic = self.dispatcher.rung_for(self.problem, m)
        except ValueError as e:              # the layer's table refused (a pin that does not fit it)
            self.skipped[m] = str(e)
            return None
        if rung != "exact" or tactic.family == registry.LAYER:
            return None
        fam = registry.get(tactic.family)
        lay = fam.layout(tactic)
        p13, p2 = bound13.packs.get(lay), bound2.packs.get(lay)
        if p13 is None or p2 is None:
            self.skipped[m] = f"{tactic} reads the {lay} layout; the block's bindings hold {sorted(bound13.packs)}"
            return None
        key = (tactic.id, id(p13), id(p2))
        launcher = self._built.get(key)
        if launcher is None:
            try:
                launcher = fam.build(self.problem, tactic, self.device)
            except RuntimeError as e:         # first met under a capture: it loads outside one
                self.skipped[m] = f"{tactic}: {e}"
                return None
            self._built = {k: v for k, v in self._built.items() if k[1:] == key[1:]}   # packs rebound: drop the old
            self._built[key] = launcher
        return launcher, p13, p2
