"""Winners that do not flip between runs, with injected timings only (no wall clock):
near-equal tactics whose timings swap inside their spread pick the same winner every run, and a
suspiciously fast timing is re-timed before it can win."""
import random

from autotune.core import winner as winner_rule
from autotune.core.records import Trial
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.strategies.successive_halving import Halving, measure

TIMER = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)


def _trial(tid, us, iqr, smem):
    return Trial("p", 1, tid, "f", "{}", "d", "l", "ok", median_us=us, iqr_us=iqr, reps=10, smem_model=smem)


def _runs(iqr: float, n: int = 300) -> set[str]:
    """Winners of n runs of two tactics 0.5 % apart, each timing within +-1 % of the truth."""
    rng, picks = random.Random(0), set()
    for _ in range(n):
        a = 10.00 * (1 + rng.uniform(-0.01, 0.01))
        b = 10.05 * (1 + rng.uniform(-0.01, 0.01))
        picks.add(winner_rule.choose([_trial("a", a, iqr, 32768), _trial("b", b, iqr, 16384),
                                      _trial("def", 20.0, iqr, 8192)], "def").tactic_id)
    return picks


def test_near_ties_inside_their_spread_do_not_flip():
    assert _runs(iqr=0.3) == {"b"}           # every run: the tie goes to the smaller smem
    assert _runs(iqr=0.0) == {"a", "b"}      # a 1 % band alone flips: the test can fail


def test_the_noise_band_is_capped():
    # a spread of 50 % does not make a 10 % slower tactic a tie
    picks = winner_rule.choose([_trial("a", 10.0, 5.0, 32768), _trial("b", 11.0, 5.0, 0)], "none")
    assert picks.tactic_id == "a"


class Scripted:
    """An executor whose timings come from a script per tactic (the last value repeats)."""

    device = "cpu"

    def __init__(self, script: dict[str, list[float]]):
        self.script, self.calls = script, {k: 0 for k in script}

    def check(self, t):
        return {"rel_err": 0.0, "smem_compiled": None}

    def time(self, t, cfg):
        seq, i = self.script[t["name"]], self.calls[t["name"]]
        self.calls[t["name"]] += 1
        return {"median_us": seq[min(i, len(seq) - 1)], "iqr_us": 0.0, "reps": cfg.min_reps}


def _run(script, halving, default="c"):
    ts = [Tactic("f", name=k) for k in script]
    ex, out = Scripted(script), []
    measure(ex, ts, Tactic("f", name=default).id, TIMER, halving, out.append)
    trials = [Trial("p", 1, o.tactic.id, "f", "{}", "d", "l", o.status, o.reason, o.median_us) for o in out]
    pick = winner_rule.choose(trials, Tactic("f", name=default).id)
    return ex, {o.tactic["name"]: o for o in out}, next(o.tactic["name"] for o in out if o.tactic.id == pick.tactic_id)


def test_a_glitch_is_retimed_before_it_wins_exhaustive():
    ex, out, win = _run({"a": [1.0, 10.0], "b": [8.0], "c": [9.0]}, Halving(exhaustive=True))
    assert ex.calls["a"] == 2 and "re-timed: 1 us" in out["a"].reason
    assert out["a"].median_us == 10.0 and win == "b"


def test_a_glitch_in_the_final_round_is_retimed():
    # the interleaved final (3 finalists, 3 cycles): a's three cycles all read 1 us, its re-time 10 us
    ex, out, win = _run({"a": [1.0, 1.0, 1.0, 10.0], "b": [8.0], "c": [9.0]}, Halving(cycles=3, budget_s=1e-3))
    assert ex.calls["a"] == 4 and win == "b"


def test_a_real_fast_tactic_keeps_winning():
    ex, out, win = _run({"a": [1.0], "b": [8.0], "c": [9.0]}, Halving(exhaustive=True))
    assert ex.calls["a"] == 2 and out["a"].median_us == 1.0 and win == "a"     # two agreeing timings
    ex, out, win = _run({"a": [7.0], "b": [8.0], "c": [9.0]}, Halving(exhaustive=True))
    assert ex.calls["a"] == 1 and win == "a"                                     # not suspicious: no re-time
