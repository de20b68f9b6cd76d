"""The search's routing draw (autotune.core.measure): uniform by default, carried by every code key,
recorded in the cache, and the report's byte counts follow the cache's draw."""
from __future__ import annotations

import pytest
import torch

from autotune.cache import Store
from autotune.core import codekey, inputs, measure
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.engine import timing
from autotune.engine.search import search
from autotune.engine.workers import Runner
from autotune.report.traffic import call_bytes, experts_touched
from autotune.tactics import registry

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)


def _loads(skew: float | None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    ids, tw = inputs.routing(2048, 64, 8, gen) if skew is None else inputs.routing(2048, 64, 8, gen, skew=skew)
    assert ids.shape == (2048, 8) and torch.allclose(tw.sum(1), torch.ones(2048))
    assert all(len(set(r.tolist())) == 8 for r in ids[:64])             # top_k distinct experts per token
    return torch.bincount(ids.flatten().long(), minlength=64).double()


def test_the_search_draws_routing_uniformly_unless_told():
    # 16,384 picks over 64 experts: 256 each when uniform; Zipf 1.2 gives the top expert ~8x the median
    even, zipf = _loads(None), _loads(1.2)
    assert measure.ROUTING_SKEW == 0.0
    assert even.max() / even.min() < 1.4
    assert zipf.max() / zipf.median() > 4


def test_experts_touched_is_exact_when_uniform():
    for e, k, m in ((256, 8, 1), (256, 8, 16), (257, 9, 64)):
        assert experts_touched(e, k, m) == pytest.approx(e * (1 - (1 - k / e) ** m))
    # the old draw touches fewer experts at mid M: half at M = 16 of GLM-5's 256, top-8
    assert experts_touched(256, 8, 16, 1.2) < 0.5 * experts_touched(256, 8, 16)


def test_the_code_key_carries_the_draw_and_the_gpu_check_digest_does_not(monkeypatch):
    from autotune.core.tactic import Tactic
    code = registry.code_of(Tactic("torch", dequant_dtype="bf16", chunk_n=0))
    key, dig = codekey.code_key("lib", code), codekey.digest(code)
    codekey.code_key.cache_clear()
    monkeypatch.setattr(measure, "ROUTING_SKEW", 1.2)
    try:
        assert codekey.code_key("lib", code) != key
        assert codekey.digest(code) == dig
    finally:
        codekey.code_key.cache_clear()


def test_skew_of_reads_the_caches_row_and_old_caches_read_as_zipf():
    assert measure.skew_of({}) == measure.LEGACY_SKEW == 1.2
    assert measure.skew_of({measure.META_KEY: "0"}) == 0.0
    with pytest.raises(ValueError, match="not a number"):
        measure.skew_of({measure.META_KEY: "uniform"})
    for bad in ("nan", "-1", "inf"):
        with pytest.raises(ValueError, match="not a Zipf exponent"):
            measure.skew_of({measure.META_KEY: bad})


def test_a_grouped_search_records_its_draw_and_the_report_counts_bytes_by_it(tmp_path):
    from autotune.report.model import collect
    moe = Problem.moe(64, 128, experts=8, top_k=2)
    store = Store(tmp_path / "c.db")
    run = dict(families=[registry.get("torch")], store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
               runner=Runner(isolate=False))
    assert search([Problem.dense(256, 512)], **run).winners
    assert measure.META_KEY not in store.meta()                # a dense search draws no routing
    assert search([moe], **run).winners
    assert store.meta()[measure.META_KEY] == "0"
    point = next(p for v in collect(store).devices for pv in v.problems if pv.key == moe.key for p in pv.points)
    assert point.bytes == call_bytes(moe, 4, 0.0)
    store.put_meta(measure.META_KEY, "1.2")                    # as an old cache's times were drawn
    point = next(p for v in collect(store).devices for pv in v.problems if pv.key == moe.key for p in pv.points)
    assert point.bytes == call_bytes(moe, 4, 1.2) < call_bytes(moe, 4, 0.0)
    store.close()


def test_a_cache_whose_draw_row_is_not_a_number_is_refused_in_one_line(tmp_path):
    import shutil
    import sqlite3
    from pathlib import Path
    from helpers import run_cli
    db = tmp_path / "c.db"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "tests" / "data" / "2026-11-29-h200-glm5-tp8-search.db", db)
    con = sqlite3.connect(db)
    con.execute("insert or replace into meta(key, value) values (?, ?)", (measure.META_KEY, "uniform"))
    con.commit()
    con.close()
    r = run_cli("show", cache=str(db))
    assert r.returncode == 2 and "routing_skew='uniform' is not a number" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1



def test_the_cpu_weight_draw_is_seeded_uniform_and_never_zero_scaled():
    """The search's weight on the CPU (engine.worker.seeded_weight: codes as 64-bit words, scales
    through a table): the same seed gives the same weight, another seed another; every byte value
    comes up about equally often; scales lie in [1/4, 4] (four octaves around 1, never zero) and
    spread over them, as inputs.seeded_weight's; one global scale 1/64 an expert."""
    from autotune.engine.worker import seeded_weight
    p = Problem.from_key("grouped_moe:bf16*nvfp4->bf16:n256:k512:e4:top2")
    a, b, c = (seeded_weight(p, "cpu", s) for s in (5, 5, 6))
    ref = inputs.seeded_weight(p, "cpu", 5)
    assert (a.packed.shape, a.scales.shape, a.scales.dtype) == (ref.packed.shape, ref.scales.shape, ref.scales.dtype)
    assert torch.equal(a.global_scale, ref.global_scale)
    assert torch.equal(a.packed, b.packed) and torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))
    assert not torch.equal(a.packed, c.packed)
    counts = torch.bincount(a.packed.flatten().long(), minlength=256).double()   # 1,024 of each expected
    assert counts.min() > 800 and counts.max() < 1250
    for w in (a, ref):
        sc = w.scales.float()
        assert sc.min() >= 0.25 and sc.max() <= 4.0 and abs(float(sc.log2().mean())) < 0.1
        assert len(sc.unique()) >= 30       # every e4m3 value of the four octaves, not a few
