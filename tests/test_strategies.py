"""Strategies as registered objects: one module each under autotune/engine/strategies/,
looked up by name; the search, the workers and the CLI ask the registry instead of comparing names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.engine import strategies, timing
from autotune.engine.options import OptionError, SearchOptions
from autotune.engine.search import search
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parents[1]
CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
DENSE = Problem.dense(256, 512)


@pytest.fixture
def first():
    from tests.strategies.first import FirstAndDefault
    strategies.register("first", "tests.strategies.first:FirstAndDefault", "the default and the first kept tactic")
    FirstAndDefault.measured.clear()
    yield FirstAndDefault
    strategies.unregister("first")


def test_a_strategy_from_one_file_and_one_registry_line_runs_a_cpu_search(tmp_path, first):
    assert "first" in strategies.names() and "first: the default and the first kept tactic" in strategies.help_text()
    store = Store(tmp_path / "c.db")
    rep = search([DENSE], families=[registry.get("torch")], store=store, buckets=Buckets.of((1, 4)), timer=FAST,
                 env=CPU, strategy="first")
    assert rep.failed == 0 and sorted(first.measured) == [(DENSE.key, 1), (DENSE.key, 4)]
    assert len(list(registry.get("torch").enumerate(DENSE, ARCHS["cpu"]))) > 2   # two of them: the strategy's doing
    for b in (1, 4):
        timed = [t for t in store.get_trials(DENSE.key, b, CPU.device_key) if t.status in ("ok", "dropped")]
        assert len(timed) == 2, [t.tactic_id for t in timed]
        assert any(t.tactic_id == store.winners()[0].default_tactic_id for t in timed)
    assert {(w.problem_key, w.bucket) for w in store.winners()} == {(DENSE.key, 1), (DENSE.key, 4)}


def test_an_unregistered_name_is_refused_in_one_line(first):
    assert SearchOptions(strategy="first").strategy == "first"
    strategies.unregister("first")
    with pytest.raises(OptionError, match="strategy must be one of ranked, halving, exhaustive, predict, got 'first'"):
        SearchOptions(strategy="first")


def test_exhaustive_flag_is_the_exhaustive_strategy():
    s, o = strategies.of(SearchOptions(halving=SearchOptions().halving.__class__(exhaustive=True)))
    assert s.name == "exhaustive" and o.strategy == "exhaustive" and o.halving.exhaustive
    assert s.redo() == {"dropped"}
    s, o = strategies.of(SearchOptions(strategy="exhaustive"))
    assert o.halving.exhaustive
    s, o = strategies.of(SearchOptions(strategy="halving"))
    assert s.name == "halving" and not o.halving.exhaustive and s.redo() == frozenset()


def test_the_search_and_the_workers_name_no_strategy():
    """Strategy names live in the registry only: search.py, workers.py and cli.py compare none."""
    names = "|".join(strategies.names())
    for f in ("autotune/engine/search.py", "autotune/engine/workers.py", "cli.py"):
        code = (ROOT / f).read_text()
        assert not re.search(rf"""["']({names})["']""", code), f
