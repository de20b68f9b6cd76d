"""The compile stage overlapped with measuring (autotune/engine/pipeline.py), on the CPU
with a test family whose precompile and build log their order (tests/families/compile_order.py).

Nothing here asserts a duration: the order of events in the log, the stored trials and the winners.
--timeout-s only turns a hang into a failure (and, in one test, is the hang that must fail)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import precompile, timing
from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, batches as ranked
from autotune.engine.strategies.successive_halving import Halving
from autotune.engine.search import Runner, search
from autotune.tactics import registry
from tests.families import compile_order as co
from tests.helpers import temp_caches

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
P1, P2 = Problem.dense(256, 512), Problem.dense(1024, 512)
GUARD_S = 120.0           # a hang guard: far past anything the family does when it works


@pytest.fixture
def corder(register_family, monkeypatch, tmp_path):
    fam = register_family("corder", "tests.families.compile_order:CompileOrder")
    monkeypatch.setenv(co.LOG, str(tmp_path / "events.log"))
    yield fam
    registry.get.cache_clear()


def _events(tmp_path: Path) -> list[tuple[str, int, str]]:
    lines = (tmp_path / "events.log").read_text().splitlines() if (tmp_path / "events.log").exists() else []
    return [(e, int(n), i) for e, n, i in (x.split() for x in lines)]


def _id(mode: str, sleep_ms: float) -> str:
    return Tactic("corder", mode=mode, sleep_ms=sleep_ms).id


def _search(store, fam, problems, buckets=(4,), *, timeout_s=GUARD_S, compile_workers=1, overlap=True,
            strategy="halving", **kw):
    return search(problems, families=[fam], store=store, buckets=Buckets.of(buckets), timer=FAST, env=CPU,
                  halving=Halving(budget_s=0.2), strategy=strategy,
                  runner=Runner(timeout_s=timeout_s, compile_workers=compile_workers, overlap_compile=overlap), **kw)


def _at0(store, p):
    return {t.tactic_id: t for t in store.get_trials(p.key, 0, CPU.device_key) if t.family == "corder"}


@pytest.fixture(scope="module")
def gated_halving(tmp_path_factory, _user_cache_home):
    """The overlapped halving search of P1 and P2 with one compile worker, where P2's `gated`
    member compiles only after some build ran: (store, report, event log). Run once per module:
    the test below reads its order, the comparison with the barrier its outcome. Its processes see
    temporary caches, as every test's do."""
    d = tmp_path_factory.mktemp("gated-halving")
    with temp_caches(d, _user_cache_home) as mp:
        mp.setenv(co.LOG, str(d / "events.log"))
        mp.setenv(co.GO, f"{P2.n}:{d / 'go'}")
        mp.setitem(registry.FAMILIES, "corder", "tests.families.compile_order:CompileOrder")
        registry.get.cache_clear()
        try:
            store = Store(d / "c.db")
            rep = _search(store, registry.get("corder"), [P1, P2])
        finally:
            registry.get.cache_clear()
    return store, rep, _events(d)


def test_a_job_measures_while_a_later_problem_still_compiles(gated_halving):
    """P2's `gated` member compiles only after some build ran. One compile worker: P1's tactics
    (first in job order) compile first, P1's job measures, its first build lets P2's compile end."""
    store, rep, ev = gated_halving
    gated, bad = _id("gated", 150.0), _id("nocompile", 300.0)
    first_build = next(i for i, e in enumerate(ev) if e[0] == "build")
    gated_end = ev.index(("compile-end", P2.n, gated))
    assert ev[first_build][1] == P1.n and first_build < gated_end      # measured before P2 finished compiling
    assert {(e[1], e[2]) for e in ev if e[0] == "build"} >= {(P2.n, gated)}
    assert not [e for e in ev if e[0] == "build" and e[2] == bad]       # a failed compile is never built
    for p in (P1, P2):
        assert _at0(store, p)[bad].status == "failed" and _at0(store, p)[bad].reason.startswith(
            "precompile failed: RuntimeError: ptxas error")
        at4 = {t.tactic_id: t for t in store.get_trials(p.key, 4, CPU.device_key)}
        # measured (timed, or dropped on a timed call by the count-bound host rule: which, depends on
        # the machine's speed, so either counts), never failed
        measured = ("ok", "dropped")
        assert bad not in at4 and at4[_id("good", 0.0)].status in measured
    assert at4[gated].status in measured and at4[gated].median_us is not None
    assert rep.compiled == 2 * len(co.MEMBERS) and rep.failed == 2
    assert {(w.problem_key, w.tactic_id) for w in rep.winners} == {(p.key, _id("good", 0.0)) for p in (P1, P2)}
    assert "compile overlapped" in rep.stages.data and rep.stages.data["compile overlapped"][0] == rep.compiled


def test_the_barrier_cannot_do_that(tmp_path, corder, monkeypatch, event_deadlines):
    """The same search with the compile stage as a barrier: nothing is built before every compile
    ended, so `gated` never compiles and is killed past --timeout-s (what the test above rules out)."""
    monkeypatch.setenv(co.GO, f"{P2.n}:{tmp_path / 'go'}")
    monkeypatch.setenv(co.GATED_HANGS, "1")
    store = Store(tmp_path / "c.db")
    _search(store, corder, [P1, P2], timeout_s=3, overlap=False)
    t = _at0(store, P2)[_id("gated", 150.0)]
    assert t.status == "failed" and t.exit_signal == signal.SIGKILL and "timed out after 3 s" in t.reason
    ev = _events(tmp_path)
    first_build = next(i for i, e in enumerate(ev) if e[0] == "build")
    assert all(e[0] != "compile-start" for e in ev[first_build:])


class _BySleep(rankmodel.Model):
    """A rank model that predicts each member by its sleep: the order is known, no LightGBM."""

    def predict(self, rows):
        return [r.get("p.sleep_ms", 0.0) for r in rows]


def _model(fam) -> _BySleep:
    arch = ARCHS["cpu"]
    names = sorted({n for p in (P1, P2) for t in fam.enumerate(p, arch) for m in (1, 4)
                    for n in rankdata.row(p, t, m, arch, 2, None)})
    return _BySleep(names, "", {"arch": "cpu"})


#: every candidate measured, one per batch after the first (the top one and the default)
ONE_BY_ONE = ranked.Ranked(min_first=1, first_share=0.0, step=1, max_share=1.0, stop_margin=1000.0)


def test_ranked_later_batches_are_compiled_by_the_pool_and_a_hang_fails_only_its_tactic(tmp_path, corder,
                                                                                        monkeypatch, event_deadlines):
    """Ranked: the first batch is compiled ahead, the rest in the background; a later batch waits
    for its tactics, so every build comes after that tactic's compile ended in a compile worker
    (the measuring worker compiles nothing itself), a compile failure there is never built, and a
    compile that hangs is killed past --timeout-s and fails only that tactic, at bucket 0."""
    monkeypatch.setenv(co.HANG, "1")
    store = Store(tmp_path / "c.db")
    rep = _search(store, corder, [P1], buckets=(1, 4), timeout_s=8, compile_workers=2, strategy="ranked",
                  rank_model=_model(corder), ranked=ONE_BY_ONE)
    ev = _events(tmp_path)
    hang, bad = _id("hang", 350.0), _id("nocompile", 300.0)
    built = [(i, e[2]) for i, e in enumerate(ev) if e[0] == "build"]
    assert {t for _, t in built} == {_id(m, s) for m, s in co.MEMBERS if m != "nocompile"}
    for i, t in built:
        assert ("compile-end", P1.n, t) in ev[:i], t
    at0 = _at0(store, P1)
    assert at0[hang].status == "failed" and at0[hang].exit_signal == signal.SIGKILL
    assert at0[hang].reason.startswith("precompile failed: timed out after 8 s while precompiling corder")
    assert at0[bad].status == "failed"
    for b in (1, 4):
        at = {t.tactic_id: t.status for t in store.get_trials(P1.key, b, CPU.device_key)}
        assert hang not in at and bad not in at and set(at.values()) == {"ok"}
    assert [(w.bucket, w.tactic_id) for w in rep.winners] == [(1, _id("good", 0.0)), (4, _id("good", 0.0))]


@pytest.fixture(scope="module")
def ranked_overlapped(tmp_path_factory, _user_cache_home):
    """The overlapped ranked search of P1 and P2 at buckets 1 and 4 with one compile worker, every
    candidate measured: (store, report, event log). Run once per module: the test below reads its
    compile order, the comparison with the barrier its outcome at bucket 4. Its processes see
    temporary caches, as every test's do."""
    d = tmp_path_factory.mktemp("ranked-overlapped")
    with temp_caches(d, _user_cache_home) as mp:
        mp.setenv(co.LOG, str(d / "events.log"))
        mp.setitem(registry.FAMILIES, "corder", "tests.families.compile_order:CompileOrder")
        registry.get.cache_clear()
        try:
            fam, store = registry.get("corder"), Store(d / "c.db")
            rep = _search(store, fam, [P1, P2], buckets=(1, 4), compile_workers=1, strategy="ranked",
                          rank_model=_model(fam), ranked=ONE_BY_ONE)
        finally:
            registry.get.cache_clear()
    return store, rep, _events(d)


def test_ranked_background_compiles_go_problem_by_problem(ranked_overlapped):
    """The background compiles one problem's later batches before the next problem's: the jobs run
    problem by problem, so that is the order they need them in (level by level over every problem,
    the first problems' jobs waited on compiles the last ones need much later). One compile worker:
    its compile-starts are the pool's order."""
    first = _id("good", 0.0)                     # the top prediction and the default: compiled ahead
    starts = [(n, t) for e, n, t in ranked_overlapped[2] if e == "compile-start" and t != first]
    later = {_id(m, s) for m, s in co.MEMBERS if (m, s) != ("good", 0.0)}
    assert {t for _, t in starts} == later and len(starts) == 2 * len(later)     # every later batch, once each
    assert [n for n, _ in starts] == [P1.n] * len(later) + [P2.n] * len(later)


@pytest.mark.parametrize("strategy", ["halving", "ranked"])
def test_the_same_winners_and_trials_as_the_barrier(tmp_path, corder, strategy, gated_halving, ranked_overlapped):
    """Overlapped or not, the same tactics are measured with the same outcome and win (at bucket
    4); only where a failed compile is recorded may differ (ranked: a later batch's compile failure
    is a bucket-0 failure overlapped, a failed check at its bucket with the barrier, whose worker
    JITs it). The overlapped side is the search of a test above (shared, not run again): halving's
    gated one, ranked's at buckets 1 and 4."""
    kw = dict(rank_model=_model(corder), ranked=ONE_BY_ONE) if strategy == "ranked" else {}
    out = {}
    for overlap in (True, False):
        if overlap:
            store, rep, _ = gated_halving if strategy == "halving" else ranked_overlapped
        else:
            store = Store(tmp_path / f"{overlap}.db")
            rep = _search(store, corder, [P1, P2], compile_workers=2, overlap=overlap, strategy=strategy, **kw)
        bad = _id("nocompile", 300.0)
        # measured or not, and how it failed; which measured tactics halving dropped is left out: it
        # ranks members 50 ms apart by wall-clock time, which no test may depend on
        trials = {(t.problem_key, t.bucket, t.tactic_id, "measured" if t.status in ("ok", "dropped") else t.status)
                  for p in (P1, P2) for t in store.get_trials(p.key, 4, CPU.device_key) if t.tactic_id != bad}
        out[overlap] = ({(w.problem_key, w.bucket, w.tactic_id) for w in rep.winners if w.bucket == 4}, trials)
    assert out[True] == out[False]
    assert len(out[True][0]) == 2 and {w[2] for w in out[True][0]} == {_id("good", 0.0)}
    assert len(out[True][1]) == 2 * (len(co.MEMBERS) - 1)      # every member but `nocompile`, in each job


def test_the_pool_serves_the_waited_for_first_and_drops_the_rest_on_close(corder, tmp_path, monkeypatch):
    """One worker held by a `gated` compile, five items queued behind it, then a wait on the last
    one: once the worker is free that one is compiled before the others. Closing a pool drops what
    is queued or compiling (a hang) without a result: nothing of it is a failure."""
    monkeypatch.setenv(co.GO, f"{P1.n}:{tmp_path / 'go'}")
    fams = {"corder": "tests.families.compile_order:CompileOrder"}
    pool = precompile.Pool("cpu", 1, fams, timeout_s=GUARD_S, preload=["corder"])
    gated = Tactic("corder", mode="gated", sleep_ms=150.0)
    goods = [Tactic("corder", mode="good", sleep_ms=float(s)) for s in range(5)]
    try:
        pool.submit([("g", P1.key, gated.to_json(), (0,))])
        while ("compile-start", P1.n, gated.id) not in _events(tmp_path):    # the one worker holds it
            threading.Event().wait(0.01)
        pool.submit([(i, P1.key, t.to_json(), (5, i)) for i, t in enumerate(goods)])
        waited: dict = {}
        th = threading.Thread(target=lambda: waited.update(pool.wait([4])))
        th.start()
        while pool.waiters == 0 and th.is_alive():     # the wait has raised item 4 (a sync point, no clock)
            th.join(0.01)
        (tmp_path / "go").touch()
        th.join(GUARD_S)
        assert waited == {4: (None, None, None)}
        assert pool.wait(range(4)) == {i: (None, None, None) for i in range(4)}
        done = [e[2] for e in _events(tmp_path) if e[0] == "compile-end"]
        assert done[:2] == [gated.id, goods[4].id]      # the waited-for one jumped the queue
    finally:
        pool.close()
    pool = precompile.Pool("cpu", 1, fams, timeout_s=GUARD_S)
    hang = Tactic("corder", mode="hang", sleep_ms=350.0)
    pool.submit([("h", P1.key, hang.to_json(), (0,)), ("x", P1.key, goods[0].to_json(), (1,))])
    assert pool.close() == 2 and pool.result("h") is None and pool.result("x") is None
    with pytest.raises(precompile.PoolClosed):
        pool.wait(["x"])
