"""`--strategy ranked`'s bucket cut (autotune/engine/strategies/ranked/cut.py): which buckets are
measured in full, the verifying round of the others (after their measured neighbours, against
their winners), the fall back to a full measurement where a neighbour's winner is not stored,
and `--measure-every 1` measuring every bucket in full."""
import math
import sqlite3
from dataclasses import replace
from types import SimpleNamespace

import pytest
from helpers import keyed

from autotune import api
from autotune.cache import Store
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.api.args import BadInput
from autotune.engine.options import Cut
from autotune.engine.search import Job, search
from autotune.engine.strategies.ranked import batches as ranked, cut
from autotune.engine.strategies.ranked.strategy import RankedStrategy
from autotune.tactics import registry

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
P = Problem.dense(2048, 512)
LADDER = (1, 2, 4, 8, 16, 32, 64)
SHORT = (1, 4, 16, 64)


def test_measured_keeps_the_ends_every_nth_the_crossovers_and_the_unsure():
    fam = {b: "torch" for b in LADDER}
    assert cut.measured(LADDER, fam, {}, 3, 0.1) == {1, 8, 64}
    assert cut.measured(LADDER, fam, {}, 1, 0.1) == set(LADDER)             # 1: every bucket
    assert cut.measured((1, 2), fam, {}, 5, 0.1) == {1, 2}
    fam[16] = fam[32] = fam[64] = "cuda"                                     # a crossover between 8 and 16
    assert cut.measured(LADDER, fam, {}, 3, 0.1) == {1, 8, 16, 64}
    assert cut.measured(LADDER, fam, {2: 0.05, 4: 0.5}, 3, 0.1) == {1, 2, 8, 16, 64}   # 2 is unsure
    assert cut.nearest(4, [1, 8, 64]) == (1, 8) and cut.nearest(64, [1, 8, 64]) == (8, None)


def test_verify_is_one_round_of_the_first_choice_and_the_given_candidates():
    ts = [Tactic("t", i=i) for i in range(12)]
    plan = ranked.plan_for(ts, [0.01 * i for i in range(12)], [ts[11]], cfg=ranked.Ranked())
    v = cut.verify(plan, [ts[10]], [ts[5].id, "not-kept"])
    assert [t.id for t in v.extras] == [ts[10].id, ts[5].id]
    stored = {t.id: 1.0 + i for i, t in enumerate(ts)}
    measured, win = ranked.simulate(v, stored, ts[10].id)
    assert sorted(measured) == sorted([ts[0].id, ts[10].id, ts[5].id]) and win == ts[0].id
    assert cut.top_two(plan) == ("t", pytest.approx(0.01)) and cut.top_two(replace(plan, order=(), pred=()))[1] == math.inf


def test_the_cut_knob_refuses_what_it_cannot_use():
    with pytest.raises(BadInput, match="^--measure-every must be a whole number >= 1, got 0$"):
        api.run([P], families="torch", buckets="1", measure_every=0, dry_run=True, cache=":memory:")
    with pytest.raises(ValueError, match="unsure"):
        Cut(unsure=-1)


def _search(store, **kw):
    return search([P], families=[registry.get("torch")], store=store, buckets=Buckets.of(SHORT), timer=FAST,
                  env=CPU, **kw)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("lightgbm")
    store = Store(tmp_path_factory.mktemp("cut") / "halving.db")
    _search(store)
    [(path, _)] = api.fit_rank(store)
    return path


def test_a_cut_search_verifies_after_its_measured_neighbours_against_their_winners(tmp_path, model):
    store = Store(tmp_path / "cut.db")
    rep = _search(store, strategy="ranked", rank_model=model, cut=Cut(every=3, unsure=0.0))
    note = next(n for n in rep.notes if "measured in full" in n)
    assert note.startswith("--strategy ranked: 2 of 4 (problem, bucket) measured in full (--measure-every 3")
    won = {w.bucket: w.tactic_id for w in store.winners(CPU.device_key)}
    assert set(won) == set(SHORT)                          # every bucket has its winner
    with sqlite3.connect(tmp_path / "cut.db") as con:     # rows in the order the trials were stored
        first, last = {}, {}
        for b, lo, hi in con.execute("SELECT bucket, min(id), max(id) FROM trials WHERE bucket > 0 GROUP BY bucket"):
            first[b], last[b] = lo, hi
    for b in (4, 16):
        ts = _trials(store, b)
        assert first[b] > max(last[m] for m in (1, 64))        # verified after every measured bucket
        low, high = cut.nearest(b, [1, 64])
        assert {won[low], won[high]} <= {t.tactic_id for t in ts}     # against the measured neighbours' winners
    every = _search(Store(tmp_path / "every.db"), strategy="ranked", rank_model=model, cut=Cut(every=1))
    assert not any("measured in full" in n for n in every.notes)
    assert {w.bucket for w in every.winners} == set(SHORT)


def _trials(store, b):
    return [t for t in store.get_trials(P.key, b, CPU.device_key) if t.status in ("ok", "dropped")]


def test_a_verifying_job_whose_measured_neighbour_has_no_winner_is_measured_in_full(tmp_path):
    ts = [Tactic("torch", i=i) for i in range(8)]
    full = ranked.plan_for(ts, [0.1 * i for i in range(8)], [ts[7]], cfg=ranked.Ranked(min_first=3))
    s = RankedStrategy()
    s.full = {P.key: frozenset({1, 8, 64})}
    s._full_plans[(P.key, 4)] = full
    view = SimpleNamespace(store=Store(tmp_path / "c.db"), env=CPU, lib_keys={"torch": CPU.lib_key(("torch",))},
                           buckets=Buckets.of(LADDER), report=SimpleNamespace(notes=[]))
    job = Job(P, 4, tuple(ts), ts[7].id, {}, rank=cut.verify(full, [ts[7]], ()))
    got = s.start(view, job)
    assert got.rank.order == full.order and got.rank.cfg == full.cfg
    assert s.in_full == [(P.key, 4, "a measured neighbour's winner is not stored")]
    assert ranked.Ranker(got.rank).first == 3                              # the full plan's first batch
    assert 4 in s.full[P.key]                                              # measured from now on
    assert view.report.notes == ["--strategy ranked: 1 verifying (problem, bucket) measured in full: "
                                 "1× a measured neighbour's winner is not stored"]


def _won(store, b, t):
    lib = CPU.lib_key(("torch",))
    store.put_winner(keyed(Winner(P.key, b, CPU.device_key, t.id, t.family, t.to_json(), lib, 1.0, t.id, None, None)))


def test_a_verifying_job_between_winners_of_two_kernels_is_measured_in_full(tmp_path):
    """A crossover the model did not predict: the measured neighbours' winners are of different
    kernels (cut.split); of one kernel, the bucket verifies them in one round."""
    ts = [Tactic("torch", kernel="a", i=i) for i in range(4)] + [Tactic("torch", kernel="b", i=i) for i in range(4)]
    full = ranked.plan_for(ts, [0.1 * i for i in range(8)], [], cfg=ranked.Ranked(min_first=3))
    store = Store(tmp_path / "c.db")
    view = SimpleNamespace(store=store, env=CPU, lib_keys={"torch": CPU.lib_key(("torch",))},
                           buckets=Buckets.of(LADDER), report=SimpleNamespace(notes=[]))
    s = RankedStrategy()
    s.full = {P.key: frozenset({1, 8, 64})}
    s._full_plans[(P.key, 4)] = s._full_plans[(P.key, 32)] = full
    for b, t in ((1, ts[0]), (8, ts[5]), (64, ts[6])):     # kernel a below 4; b at 8 and 64
        _won(store, b, t)
    got = s.start(view, Job(P, 4, tuple(ts), ts[7].id, {}, rank=cut.verify(full, [ts[7]], ())))
    assert got.rank.cfg == full.cfg and s.in_full == [(P.key, 4, "its measured neighbours were won by different kernels")]
    got = s.start(view, Job(P, 32, tuple(ts), ts[7].id, {}, rank=cut.verify(full, [ts[7]], ())))
    assert ranked.Ranker(got.rank).cap == 1 and {t.id for t in got.rank.extras} == {ts[7].id, ts[5].id, ts[6].id}
