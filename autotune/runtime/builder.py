"""Building a problem's Table: kernels built once per (problem, tactic) with every operand
checked per call (the unbound form), the default rung resolved lazily, and a re-install keeping
the old table's counts and pin."""
from __future__ import annotations

from autotune.core.arch import Arch
from autotune.core.env import Env
from autotune.core.operands import Checked, checked
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.table import LazyDefault, Table
from autotune.tactics import registry
from autotune.tactics.base import as_launcher


class TableBuilder:
    """warn: say once, when a problem first falls to its default rung, which GPU it ran on.
    scratch: the dispatcher's ScratchPool, attached to every kernel built here."""

    def __init__(self, env: Env, arch: Arch, warn: bool = True, scratch=None):
        self.env, self.arch, self.warn, self.scratch = env, arch, warn, scratch
        self._built: dict[tuple[Problem, Tactic], Checked] = {}

    def kernel(self, p: Problem, t: Tactic) -> Checked:
        """The unbound kernel(x, w, ...), every operand checked against `p` on each call."""
        k = self._built.get((p, t))
        if k is None:
            k = self._built[(p, t)] = checked(p, as_launcher(registry.get(t.family).build(p, t, self.env.device)))
            if self.scratch is not None:
                k.attach(self.scratch)          # the dispatcher's pool: one workspace per stream for all
        return k

    def default_tactic(self, p: Problem) -> Tactic:
        return registry.designated_default(p, self.arch, self.env.device)

    def table(self, p: Problem, items: list[tuple[int, Tactic]], old: Table | None = None,
              predicted: frozenset[int] | set[int] = frozenset()) -> Table:
        """The ladder over `items` (vetted (bucket, tactic) rows sorted by bucket; those of the
        buckets in `predicted` predicted winners) and the default."""
        dt = self.default_tactic(p)
        t = Table(p, tuple(b for b, _ in items), tuple(self.kernel(p, x) for _, x in items),
                  tuple(x for _, x in items),
                  LazyDefault(self.kernel, p, dt, self.env.gpu_name if self.warn else None), dt,
                  tuple(b in predicted for b, _ in items))
        if old is not None:      # keep counts and pins across a re-install
            t.counts, t.misses = old.counts, old.misses
            if old.pinned is not None:
                t._set_pin(old.pinned, old.pinned_tactic)
        return t
