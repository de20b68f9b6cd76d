"""The count-bound host rule of successive halving (autotune.engine.strategies.successive_halving.measure_host), with
scripted check and timing figures only (no wall clock): on the CPU, where one call outlasts the job's
budget, the check's call is each tactic's first sample, slower tactics are dropped on it, and only the
near-ties and the default are timed again, once."""
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.executor import TacticError
from autotune.engine.strategies.successive_halving import Halving, count_bound, measure

TIMER = timing.TimerConfig(warmup=0, min_reps=3, max_reps=100, budget_s=0.25)


class Host:
    """An executor on a host clock: each check says its call's host seconds; timings are scripted."""

    def __init__(self, check_s: dict[str, float], time_us: dict[str, float], device: str = "cpu"):
        self.check_s, self.time_us, self.device = check_s, time_us, device
        self.timed: list[tuple[str, int]] = []

    def check(self, t):
        return {"rel_err": 1e-3, "smem_compiled": None, "parts": {"call": self.check_s[t["name"]]}}

    def time(self, t, cfg):
        # as engine.timing does for a call far shorter than cfg.budget_s: as many calls as cfg allows
        self.timed.append((t["name"], cfg.max_reps))
        return {"median_us": self.time_us[t["name"]], "iqr_us": 0.0, "reps": cfg.max_reps}


def _run(check_s, time_us, h=Halving(), default="d", device="cpu"):
    ex, out = Host(check_s, time_us, device), []
    ts = [Tactic("f", name=k) for k in check_s]
    measure(ex, ts, Tactic("f", name=default).id, TIMER, h, out.append)
    return ex, {o.tactic["name"]: o for o in out}


def test_slow_checks_drop_their_tactics_and_the_near_ties_are_timed_once():
    # 0.1 s calls: far over the 0.3 s budget's share of each of 4 tactics
    ex, out = _run({"a": 0.10, "b": 0.11, "c": 0.30, "d": 0.20}, {"a": 1.2e5, "b": 1.0e5, "d": 2.1e5})
    assert sorted(ex.timed) == [("a", 1), ("b", 1)]        # one call each for the near-ties only
    assert out["c"].status == "dropped" and out["c"].median_us == 3e5 and out["c"].reps == 1
    assert "dropped on its check call" in out["c"].reason
    assert {k: o.status for k, o in out.items()} == {"a": "ok", "b": "ok", "c": "dropped", "d": "ok"}
    # the stored time is the median of the check's call and the timed call
    assert out["b"].median_us == (1.1e5 + 1.0e5) / 2 and out["b"].reps == 2 and out["b"].iqr_us == 1e4
    assert out["b"].reason == "count-bound host: the median of its check call and one more"
    # the default, far behind, keeps its check's time (the winner rule compares against it)
    assert out["d"].median_us == 2e5 and out["d"].reps == 1 and "the default" in out["d"].reason


def test_a_leader_with_no_near_tie_keeps_its_check_time_and_a_suspicious_one_is_retimed():
    ex, out = _run({"a": 0.20, "c": 0.26, "d": 0.28}, {"a": 2e5})
    assert ex.timed == [] and out["a"].median_us == 2e5 and out["a"].reps == 1 and out["d"].status == "ok"
    assert out["c"].status == "dropped"
    # under half the runner-up's time: timed once more before it can win, and the new time stands
    ex, out = _run({"a": 0.2, "d": 0.5}, {"a": 4.5e5})
    assert ex.timed == [("a", 1)] and out["a"].median_us == 4.5e5 and "re-timed" in out["a"].reason


def test_fast_calls_and_gpus_keep_successive_halving():
    fast = {"a": 1e-5, "b": 2e-5, "c": 3e-5, "d": 4e-5}
    ex, out = _run(fast, {k: v * 1e6 for k, v in fast.items()})
    assert all(o.status == "ok" for o in out.values()) and len(ex.timed) >= 3 * 4   # the interleaved final
    ex, _ = _run({"a": 0.1, "d": 0.3}, {"a": 1e5, "d": 3e5}, device="cuda")
    assert len(ex.timed) >= 2 * 3
    ex, _ = _run({"a": 0.1, "d": 0.3}, {"a": 1e5, "d": 3e5}, h=Halving(host_window=0))   # the rule off
    assert len(ex.timed) >= 2 * 3


def test_count_bound_needs_every_check_call():
    ts = [Tactic("f", name="a"), Tactic("f", name="b")]
    h = Halving()
    checked = {ts[0].id: {"parts": {"call": 0.5}}, ts[1].id: {}}
    assert not count_bound(Host({}, {}), ts, checked, h)
    checked[ts[1].id] = {"parts": {"call": 0.4}}
    assert count_bound(Host({}, {}), ts, checked, h)
    assert not count_bound(Host({}, {}), ts, checked, Halving(exhaustive=True))


class Replaying(Host):
    """`Host` with the replay check: the names in `wrong` fail it; every replay is recorded."""

    def __init__(self, *a, wrong=(), **kw):
        super().__init__(*a, **kw)
        self.wrong, self.replayed, self.events = set(wrong), [], []

    def forget(self, t):
        self.events.append(("forget", t["name"]))

    def replay(self, t):
        self.replayed.append(t["name"])
        self.events.append(("replay", t["name"]))
        if t["name"] in self.wrong:
            raise TacticError("largest row relative error 1 (row 0)")


def _replayed(wrong=(), d_s=0.2, d_us=None):
    # a and b tie within 1 %; c is a near-tie (inside host_window) but 5 % behind; d is the default
    time_us = {"a": 1.0e5, "b": 1.005e5, "c": 1.05e5, **({"d": d_us} if d_us else {})}
    ex, out = Replaying({"a": 0.100, "b": 0.101, "c": 0.105, "d": d_s}, time_us, wrong=wrong), []
    ts = [Tactic("f", name=k) for k in "abcd"]
    measure(ex, ts, Tactic("f", name="d").id, TIMER, Halving(), out.append)
    return ex, {o.tactic["name"]: o for o in out}


def test_only_the_tactics_that_can_win_are_replayed():
    ex, out = _replayed()
    assert sorted(ex.replayed) == ["a", "b"]        # the tied fastest; the default, 2x slower, cannot win
    assert [k for k, o in out.items() if o.replay_checked] == sorted(ex.replayed)
    assert out["c"].status == out["d"].status == "ok" and not out["c"].replay_checked
    # a default within the margin (3 %) of the fastest can still win: it is replayed too
    ex, out = _replayed(d_s=0.1015, d_us=1.02e5)
    assert sorted(ex.replayed) == ["a", "b", "d"] and out["d"].replay_checked


def test_every_finalist_is_forgotten_before_the_first_replay():
    # the timed kernels' scratch is gone before a replay binds its own launcher
    ex, out = _replayed()
    first = ex.events.index(("replay", "a"))
    assert {n for kind, n in ex.events[:first] if kind == "forget"} == {"a", "b", "c", "d"}


def test_a_replay_failure_draws_the_contenders_again():
    ex, out = _replayed(wrong={"a", "b"})
    assert ex.replayed == ["a", "b", "c"]           # c leads once a and b are out
    assert {k: o.status for k, o in out.items()} == {"a": "failed", "b": "failed", "c": "ok", "d": "ok"}
    assert "wrong under graph replay" in out["a"].reason and out["c"].replay_checked
