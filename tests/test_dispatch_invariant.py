"""Batch-invariant serving (Dispatcher(batch_invariant=True), $AUTOTUNE_BATCH_INVARIANT or vLLM's
$VLLM_BATCH_INVARIANT): one batch-invariant tactic per problem for every M, or a one-line error.
Real SQLite caches; the `rowwise` test family (invariant by construction) and the torch family
(not invariant) run on the CPU."""
from __future__ import annotations


import pytest
import torch

from helpers import dispatcher_and_warnings, keyed
from autotune.core import inputs
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.cache import Store

CPU = cpu()
P, Q = Problem.dense(256, 512), Problem.dense(128, 256)
LIB = CPU.lib_key(("torch",))
R1 = Tactic("rowwise", dequant_dtype="fp32", chunk_n=0)
R2 = Tactic("rowwise", dequant_dtype="bf16", chunk_n=0)
TA = Tactic("torch", dequant_dtype="fp32", chunk_n=0)


@pytest.fixture
def rowwise(register_family):
    return register_family("rowwise", "tests.families.rowwise:RowwiseFamily")


def _cache(path, items):
    with Store(path) as s:
        s.put_environment(CPU, ("torch",))
        for p, b, t in items:
            s.put_winner(keyed(Winner(p.key, b, CPU.device_key, t.id, t.family, t.to_json(), LIB, 10.0, TA.id, 11.0, 1.1)))
    return path


def _disp(path, **kw):
    return dispatcher_and_warnings(path, env=CPU, **kw)


def test_one_invariant_tactic_for_every_m_and_rows_that_do_not_depend_on_the_batch(tmp_path, rowwise):
    path = _cache(tmp_path / "c.db", [(P, 1, R1), (P, 4, R1), (P, 16, R2), (P, 64, TA)])
    d, warned = _disp(path, batch_invariant=True)
    # the invariant winner of the most buckets, for every M (beyond the ladder too); warned once
    assert {d.tactic_for(P, m)[1] for m in (1, 3, 16, 64, 5000)} == {R1}
    assert [w for w in warned if "batch-invariant" in w] and "2 of 4 buckets" in d.invariant_notes[P.key]
    s = inputs.make_inputs(P, 64, "cpu", seed=1)[0]
    many = d((64, P.n, P.k))(s.x, s.w)
    for i in (0, 31, 63):
        assert torch.equal(d((1, P.n, P.k))(s.x[i:i + 1], s.w)[0], many[i])
    # without the mode: the per-bucket ladder, as before
    plain, _ = _disp(path, batch_invariant=False)
    assert [plain.tactic_for(P, m)[1] for m in (1, 16, 64)] == [R1, R2, TA] and not plain.invariant_notes


def test_a_batch_invariant_search_cache_is_served_as_stored(tmp_path, rowwise):
    d, warned = _disp(_cache(tmp_path / "c.db", [(P, b, R2) for b in (1, 8, 64)]), batch_invariant=True)
    assert {d.tactic_for(P, m)[1] for m in (1, 9, 4096)} == {R2}
    assert not [w for w in warned if "batch-invariant" in w]


def test_no_invariant_tactic_is_a_one_line_error_never_a_silent_mix(tmp_path, rowwise):
    d, _ = _disp(_cache(tmp_path / "c.db", [(P, 1, TA), (Q, 1, R1)]), batch_invariant=True)
    # P: only a torch winner and the torch default (neither invariant on the CPU)
    for call in (lambda: d.table(P), lambda: d((4, P.n, P.k)), lambda: d(P, 4),
                 lambda: d.bind(P, inputs.seeded_weight(P, "cpu", 0))):
        with pytest.raises(ValueError, match=r"no batch-invariant tactic .* `autotune search --batch-invariant`") as e:
            call()
        assert "\n" not in str(e.value)
    assert d.tactic_for(Q, 7)[1] == R1
    with pytest.raises(ValueError, match="not batch-invariant"):      # a pin must be invariant too
        d.pin(Q, TA)
    d.pin(P, R2)                                                     # an invariant pin serves P
    assert d.tactic_for(P, 3)[1] == R2 and d._dense[P.n][P.k] == d.table(P).__call__   # fast path again
    d.unpin(Q)                                                       # back to its one tactic
    assert d.tactic_for(Q, 3)[1] == R1


def test_the_switch_comes_from_the_environment(tmp_path, rowwise, monkeypatch):
    path = _cache(tmp_path / "c.db", [(P, 1, R1), (P, 64, TA)])
    monkeypatch.delenv("AUTOTUNE_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    d, _ = _disp(path)
    assert d.batch_invariant and d.tactic_for(P, 64)[1] == R1
    monkeypatch.setenv("AUTOTUNE_BATCH_INVARIANT", "0")
    d, _ = _disp(path)
    assert not d.batch_invariant and d.tactic_for(P, 64)[1] == TA


def test_fp4moe_unfused_is_refused_in_batch_invariant_mode(tmp_path):
    from autotune.runtime.moe import FP4MoE
    d, _ = _disp(tmp_path / "none.db", batch_invariant=True)
    g, u, dn = torch.randn(4, 16, 64), torch.randn(4, 16, 64), torch.randn(4, 64, 16)
    with pytest.raises(ValueError, match="batch-invariant mode needs fused=True"):
        FP4MoE.from_float(g, u, dn, 2, fused=False, dispatcher=d)


def test_unpin_without_an_invariant_tactic_is_refused_and_the_pin_stays(tmp_path, rowwise):
    d, _ = _disp(_cache(tmp_path / "c.db", [(P, 1, TA)]), batch_invariant=True)
    d.pin(P, R2)
    bt = d.bind(P, inputs.seeded_weight(P, "cpu", 0))
    with pytest.raises(ValueError, match="cannot unpin: .*no batch-invariant tactic"):
        d.unpin(P)
    assert bt.table.rung_for(4) == ("pinned", R2) and d.tactic_for(P, 4)[1] == R2   # bound layers too
