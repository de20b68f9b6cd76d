"""The worker's memory across a search: nothing tactic-sized outlives its job, a tactic
the search drops is freed at once, held scratch stays under a bound, and an out-of-memory caused by
the framework (inputs, other tactics' memory) never becomes a tactic's failure. CPU, in-process,
with a test family whose kernels keep scratch the way real launchers do."""
from __future__ import annotations

import gc

import pytest
import torch

from autotune.core import inputs
from autotune.core.buckets import Buckets
from autotune.core.env import current
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.strategies.successive_halving import Halving
from autotune.engine.search import Runner, search
from autotune.engine.worker import Bench
from autotune.cache import Store
from tests.families import scratchy

P = Problem.dense(256, 512)
FAST = dict(timer=timing.TimerConfig(budget_s=0.002, max_reps=3), halving=Halving(budget_s=0.02))


@pytest.fixture
def fam(register_family):
    scratchy.LIVE.clear()
    f = register_family("scratchy", "tests.families.scratchy:ScratchyFamily")
    yield f
    gc.collect()


def _tactic(mode: str, kb: int) -> Tactic:
    return Tactic("scratchy", mode=mode, kb=kb)


def test_forget_and_end_job_free_every_tactics_scratch(fam):
    b = Bench("cpu")
    b.setup(P.key, 4, 0)
    ts = [_tactic("keep", kb) for kb in (64, 128, 256)]
    for t in ts:
        b.check(t)
    assert len(scratchy.LIVE) == 3
    b.forget(ts[0].id)           # the search dropped it: its scratch goes at once
    gc.collect()
    assert {t for t, _, _ in scratchy.LIVE.values()} == {ts[1].id, ts[2].id}
    out = b.end_job()
    gc.collect()
    assert scratchy.LIVE == {} and out["kept"] > 0     # the weights stay on purpose, nothing else


def test_held_scratch_stays_under_the_bound(fam):
    """With `keep_bytes` below what the kernels would keep, each request's kernel is dropped after it:
    never more than the bound plus one tactic's scratch is alive."""
    one = 256 * 1024 * 8           # the largest tactic's scratch at M=8 (kb 256 x 256 x 8 floats of 4 B)
    b = Bench("cpu", keep_bytes=one, allocated=scratchy.live_bytes)
    b.setup(P.key, 8, 0)
    peak = 0
    for kb in (64, 128, 256, 64, 128, 256):
        t = _tactic("keep", kb)
        b.check(t)
        b.time(t, timing.TimerConfig(budget_s=0.001, min_reps=1, max_reps=1))
        gc.collect()
        peak = max(peak, scratchy.live_bytes())
    assert peak <= 2 * one


def test_a_search_leaves_no_scratch_of_a_job_in_the_next(fam, tmp_path, monkeypatch):
    """Every kernel call checks what is alive: scratch of another M (an earlier job) is a leak."""
    leaks = []
    real = scratchy._track

    def track(t, tid, m):
        leaks.extend((tid, mm) for _, mm, _ in [v for v in scratchy.LIVE.values()] if mm != m)
        real(t, tid, m)
    monkeypatch.setattr(scratchy, "_track", track)
    store = Store(tmp_path / "c.db")
    env = current()
    rep = search([P], families=[fam], store=store, buckets=Buckets.of((1, 2, 4, 8)), env=env,
                 runner=Runner(isolate=False), **FAST)
    gc.collect()
    assert leaks == [] and scratchy.LIVE == {}
    assert rep.job_failures == [] and len(rep.winners) == 4


def test_out_of_memory_caused_by_other_tactics_is_retried_and_an_own_one_fails(fam, tmp_path):
    store = Store(tmp_path / "c.db")
    env = current()
    search([P], families=[fam], store=store, buckets=Buckets.of((4,)), env=env,
           runner=Runner(isolate=False), **FAST)
    got = {t.tactic_id: t for t in store.get_trials(P.key, 4, env.device_key)}
    crowded = [got[_tactic("crowded", kb).id] for kb in (64, 128, 256)]
    assert all(t.status in ("ok", "dropped") for t in crowded), [t.reason for t in crowded]
    own = [got[_tactic("oom", kb).id] for kb in (64, 128, 256)]
    assert all(t.status == "failed" and "with every other tactic's memory freed" in t.reason for t in own)


def test_input_setup_out_of_memory_is_the_jobs_condition_not_its_tactics(fam, tmp_path, monkeypatch):
    """Setup is retried once with the same inputs; failing twice, the job is reported with its reason
    and its tactics stay unmeasured (no failed trial), so a rerun measures them."""
    real, calls = inputs.make_inputs, {"n": 0}

    def flaky(*a, **kw):      # out of memory once per job: the retry succeeds
        calls["n"] += 1
        if calls["n"] % 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*a, **kw)
    monkeypatch.setattr(inputs, "make_inputs", flaky)
    store, env = Store(tmp_path / "c.db"), current()
    rep = search([P], families=[fam], store=store, buckets=Buckets.of((1, 2)), env=env,
                 runner=Runner(isolate=False), **FAST)
    assert rep.job_failures == [] and len(rep.winners) == 2 and calls["n"] == 4

    def broken(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
    monkeypatch.setattr(inputs, "make_inputs", broken)
    store2 = Store(tmp_path / "d.db")
    rep = search([P], families=[fam], store=store2, buckets=Buckets.of((1, 2)), env=env,
                 runner=Runner(isolate=False), **FAST)
    assert len(rep.job_failures) == 2 and all("input setup failed twice: OutOfMemoryError" in f
                                              for f in rep.job_failures)
    assert rep.failed == 0 and rep.winners == []
    assert [t for t in store2.get_trials(P.key, 1, env.device_key) if t.status == "failed"] == []
    monkeypatch.setattr(inputs, "make_inputs", real)
    rep = search([P], families=[fam], store=store2, buckets=Buckets.of((1, 2)), env=env,
                 runner=Runner(isolate=False), **FAST)
    assert rep.job_failures == [] and len(rep.winners) == 2 and rep.measured > 0


def test_setup_is_retried_in_a_fresh_worker(fam, tmp_path, monkeypatch):
    """A worker may hold what it cannot free (a failed capture's pool: timing.abandon): the retry of a
    setup that ran out of memory runs in a new one. In-process, a new Bench; the first one's inputs
    keep failing, the second's draw."""
    import autotune.engine.workers as W
    benches, real = [], inputs.make_inputs
    init = Bench.__init__

    def counting_init(self, *a, **kw):
        benches.append(self)
        init(self, *a, **kw)

    def first_bench_fails(*a, **kw):
        if len(benches) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.38 GiB")
        return real(*a, **kw)
    monkeypatch.setattr(Bench, "__init__", counting_init)
    monkeypatch.setattr(inputs, "make_inputs", first_bench_fails)
    ex = W.InlineExecutor("cpu")
    from autotune.engine.search import Job
    from autotune.engine.sink import Collect
    t = _tactic("keep", 64)
    got = Collect()
    assert W.run_job(ex, Job(P, 4, (t,), t.id), FAST["timer"], FAST["halving"], 0, got) is None
    assert len(benches) == 2 and [o.status for o in got.outcomes] == ["ok"]
    assert got.stages.data["recycle"][0] == 1


class _Leaky:
    """An executor whose jobs end with a failed capture whose pool was not handed back."""

    def __init__(self, released: int):
        self.device, self.released, self.recycled = "cpu", released, 0
        self._ex = None

    def setup(self, *a):
        pass

    def check(self, t):
        return {"rel_err": 0.0, "smem_compiled": None}

    def time(self, t, timer):
        return {"median_us": 1.0, "iqr_us": 0.0, "reps": 1}

    def forget(self, t):
        pass

    def end_job(self):
        return {"allocated": 0, "kept": 0, "peak": 0, "captures_failed": 2, "pools_released": self.released,
                "pools_kept": 2 - self.released}

    def recycle(self):
        self.recycled += 1

    def close(self):
        pass


@pytest.mark.parametrize("released, recycled", [(2, 0), (1, 1)])
def test_a_job_that_leaked_a_capture_pool_ends_its_worker(fam, released, recycled):
    import autotune.engine.workers as W
    from autotune.engine.search import Job
    from autotune.engine.sink import Collect
    t = _tactic("keep", 64)
    ex, got = _Leaky(released), Collect()
    assert W.run_job(ex, Job(P, 4, (t,), t.id), FAST["timer"], FAST["halving"], 0, got) is None
    assert ex.recycled == recycled
    assert got.stages.counts == {"captures_failed": 2, "pools_released": released,
                                 **({"pools_kept": 2 - released} if released < 2 else {})}


def test_stages_sum_capture_counts_and_keep_the_largest_reserve():
    from autotune.engine.stages import Stages
    a, b = Stages(), Stages()
    a.job_memory({"allocated": 1, "kept": 1, "reserved": 10, "peak_reserved": 30, "captures_failed": 3,
                  "pools_released": 3}, "j1")
    a.job_memory({"allocated": 1, "kept": 1, "reserved": 20, "peak_reserved": 25, "captures_failed": 1,
                  "pools_released": 0}, "j2")
    b.merge(a.state())
    b.merge(a.state())
    assert a.memory["reserved_after_job"] == 20 and a.memory["peak_reserved"] == 30
    assert a.counts == {"captures_failed": 4, "pools_released": 3}
    assert b.counts == {"captures_failed": 8, "pools_released": 6} and b.memory["peak_reserved"] == 30


def test_a_recycled_process_worker_restarts_with_the_jobs_setup(fam):
    """ProcessExecutor.recycle kills the worker; the next request starts a new one, which replays
    the setup (so the job goes on there)."""
    from autotune.engine.workers import ProcessExecutor
    ex = ProcessExecutor("cpu", timeout_s=120, families={"scratchy": "tests.families.scratchy:ScratchyFamily"})
    try:
        ex.setup(P.key, 4, 0)
        first = ex.pids[-1]
        ex.recycle()
        out = ex.check(_tactic("keep", 64))
        assert out["rel_err"] < 1e-2 and ex.pids[-1] != first and ex.restarts == 1
    finally:
        ex.close()


def test_collect_young_still_collects_new_cycles_and_thaw_lets_frozen_ones_go():
    """The worker's end-of-job collection (worker.collect_young) freezes what survived, so the next
    walks only new objects: a cycle made after it is still collected; one among frozen objects waits
    for `thaw` (the worker thaws when the problem changes)."""
    import weakref
    from autotune.engine import worker

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)
    try:
        old = cycle()
        worker.collect_young()            # `old` is garbage: collected before the freeze
        assert old() is None and gc.get_freeze_count() > 0
        kept = Node()
        kept.me = kept                    # alive at the freeze: frozen
        ref = weakref.ref(kept)
        worker.collect_young()
        del kept
        new = cycle()
        worker.collect_young()
        assert new() is None              # made after the freeze: collected
        assert ref() is not None          # frozen garbage: waits
        assert gc.get_freeze_count() > 0 and not any(o is ref() for o in gc.get_objects())
        assert gc.get_referrers(ref()) == []              # its frozen __dict__ is invisible too
        with worker.unfrozen():               # what live_tensors walks: frozen objects and their referrers
            assert any(o is ref() for o in gc.get_objects()) and gc.get_referrers(ref()) != []
        assert gc.get_freeze_count() > 0
        worker.thaw()
        gc.collect()
        assert ref() is None and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
