"""`--strategy predict`: nothing timed. Per (problem, bucket) the rank model's first choice among the
tactics the search keeps there, built and checked once against the float64 reference (so its
compile happens now, at predict time: cold compiler caches count), then checked as an engine serves
it under graph replay (autotune.engine.replay), and stored as a *predicted* winner, replay-checked;
one wrong under replay is stored as a failed trial and predicts nothing there. Dispatch serves it
on its own rung, below a measured winner of the same bucket (autotune/runtime/table.py); a later
measured search replaces it, and a prediction never replaces a measured winner
(autotune/cache/store.py). A (problem, bucket) whose measured winner is stored is left alone.

Without a model for the live arch (or for its library versions) nothing is predicted: the notes say
why in one line and name the family defaults every problem then serves."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Callable

from autotune.engine.strategies.ranked import plans
from autotune.engine.executor import Outcome, TacticError, WorkerLost
from autotune.engine.strategies.base import PREDICTED, HalvingStrategy, SearchView
from autotune.tactics import registry


class PredictStrategy(HalvingStrategy):
    name = "predict"

    def __init__(self) -> None:
        self._first: dict = {}                  # (problem key, bucket) -> the model's first choice
        self._measured: set[tuple[str, int]] = set()

    def prepare(self, s: SearchView, work: list) -> None:
        model, note = plans.load_model(s.o.rank_model, s.store, s.target, dict(s.env.libs))
        if model is None:
            named = Counter(str(w.default) for w in work)
            s.report.notes.append(f"--strategy predict: {note}; nothing predicted, each problem serves its family "
                                  "default (" + "; ".join(f"{t} for {n} problem{'s' * (n > 1)}"
                                                          for t, n in named.items()) + ")")
            return
        s.report.notes.append(f"--strategy predict: {note}; each (problem, bucket) stores the model's first choice, "
                              "checked against float64 and under graph replay, not timed")
        self._first = plans.firsts(model, work, list(s.buckets), s.target, s.env.sm_count or 0)
        self._measured = {(w.problem_key, w.bucket) for w in s.store.winners(s.env.device_key)
                          if not w.predicted and registry.fresh(s.lib_keys, w)}

    def kept_at(self, w: Any, bucket: int) -> list:
        """The first choice's row alone (what the job checks), or none."""
        first = self._first.get((w.problem.key, bucket))
        return [r for r in w.kept if r.tactic == first] if first is not None else []

    def redo(self) -> frozenset[str]:
        return frozenset({"ok", "dropped"})    # a timed trial does not stand for a check made now

    def precompiled(self, items: list) -> list:
        first = {(pk, t) for (pk, _), t in self._first.items()}
        return [r for r in items if (r.problem.key, r.tactic) in first]

    def job(self, s: SearchView, job: Any, kept_ids: set[str]) -> tuple[Any, bool]:
        key = (job.problem.key, job.bucket)
        first = self._first.get(key)
        if first is None or first.id not in kept_ids or key in self._measured:
            return replace(job, tactics=(), strategy=self.name), False
        return replace(job, tactics=(first,), strategy=self.name), False

    @staticmethod
    def measure(ex: Any, job: Any, timer: Any, h: Any, emit: Callable,
                wait: Callable[[list], list] | None = None) -> None:
        """Check the first choice (once its compile is done) against float64, then under graph replay
        as an engine serves it (autotune.engine.replay, as a measured search's finalists are); passed
        both: a predicted outcome whose time is the checked call's host time (not a timing), stored
        replay-checked. Wrong under replay: a failed trial, and no prediction stands for the bucket
        (it serves what the ladder gives below: a measured neighbour or the default). An executor
        without the replay check (a test's stand-in) stores its prediction not replay-checked."""
        from autotune.engine.strategies.successive_halving import check_call_us
        replay = getattr(ex, "replay", None)
        for t in (wait(list(job.tactics)) if wait is not None else job.tactics):
            try:
                c = ex.check(t)
            except TacticError as e:
                emit(Outcome(t, "failed", str(e)))
                continue
            except WorkerLost as e:
                emit(Outcome(t, "failed", e.reason, exit_signal=e.exit_signal))
                continue
            if replay is not None:
                try:
                    ex.forget(t)            # the bound launcher is the only one alive beside the inputs
                    replay(t)
                except (TacticError, WorkerLost) as e:
                    why = e.reason if isinstance(e, WorkerLost) else str(e)
                    emit(Outcome(t, "failed", "wrong under graph replay: " + why, rel_err=c["rel_err"],
                                 exit_signal=getattr(e, "exit_signal", None)))
                    continue
            emit(Outcome(t, PREDICTED, "predicted: the rank model's first choice, checked"
                         + (" and replay-checked" if replay is not None else "") + ", not timed",
                         check_call_us(c) or 1.0, None, 0, c["rel_err"], c.get("smem_compiled"),
                         replay_checked=replay is not None))
