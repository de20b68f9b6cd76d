"""Problem, buckets, arch table, Tactic ids and the winner rule."""
import json
import random

import pytest

from autotune.core.buckets import Buckets, hybrid, vllm_cudagraph_sizes
from autotune.core.problem import Problem
from autotune.core.records import Trial
from autotune.core.winner import choose, contenders
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic, Verdict


def test_hybrid_buckets_match_flashinfer():
    assert hybrid(8192) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048,
                            2560, 3072, 3584, 4096, 8192)
    assert hybrid(16) == (1, 2, 4, 8, 16)
    assert hybrid(100)[-1] == 100


def test_bucket_rounds_up_and_clamps():
    b = Buckets.of([1, 2, 4, 8, 16])
    assert [b.bucket(m) for m in (1, 3, 5, 16, 17, 10**6)] == [1, 4, 8, 16, 16, 16]
    with pytest.raises(ValueError, match="M must be a positive integer, got 0"):
        b.bucket(0)


def test_bucket_parse_forms():
    assert Buckets.parse("8,1,4").values == (1, 4, 8)
    assert Buckets.parse("vllm:32").values == vllm_cudagraph_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    with pytest.raises(ValueError, match="'x'"):
        Buckets.parse("1,x")
    with pytest.raises(ValueError):
        Buckets.parse("0,4")


def test_problem_key_round_trip_and_validation():
    p = Problem.dense(3072, 6144)
    assert p.key == "dense:bf16*nvfp4->bf16:n3072:k6144"
    q = Problem.moe(512, 6144, 256, 8)
    for x in (p, q, Problem.dense(2880, 2880, w_fmt="mxfp4")):
        assert Problem.from_key(x.key) == x
    with pytest.raises(ValueError, match="K=100 is not a multiple of the nvfp4 block"):
        Problem.dense(64, 100)
    with pytest.raises(ValueError, match="K=48 is not a multiple of the mxfp4 block"):
        Problem.dense(64, 48, w_fmt="mxfp4")
    with pytest.raises(ValueError, match="N must be a positive integer, got 0"):
        Problem.dense(0, 64)
    with pytest.raises(ValueError, match="N must be a positive integer, got -5"):
        Problem.dense(-5, 64)
    with pytest.raises(ValueError, match="top_k=9 exceeds"):
        Problem.moe(64, 64, 8, 9)


def test_arch_table_numbers():
    assert get_arch("sm120").smem_per_block_optin == 101376
    assert get_arch("sm_121a").smem_per_block_optin == 101376
    assert get_arch("12.0").max_threads_per_sm == 1536
    for n in ("sm90", "sm100", "sm103"):
        assert get_arch(n).smem_per_block_optin == 232448
        assert get_arch(n).smem_per_sm == 233472
    assert get_arch("sm80").smem_per_block_optin == 166912
    assert {a.fp4 for a in ARCHS.values() if a.cc >= (10, 0)} == {"native"}
    assert get_arch("sm90").fp4 == "emulated"
    with pytest.raises(ValueError, match="unknown arch 'sm70'"):
        get_arch("sm70")


def test_tactic_id_is_canonical_and_stable():
    a = Tactic("triton", {"block_m": 64, "num_warps": 4})
    b = Tactic("triton", num_warps=4, block_m=64)
    assert a == b and a.id == b.id and hash(a) == hash(b)
    assert Tactic.from_json(a.to_json()) == a
    assert json.loads(a.to_json()) == {"family": "triton", "params": {"block_m": 64, "num_warps": 4}}
    # the id is a function of the canonical JSON alone: pinned so a refactor cannot change it silently
    assert a.id == "e53a3d6a98dc0a6a"
    assert Tactic("torch", block_m=64, num_warps=4).id != a.id
    with pytest.raises(TypeError):
        Tactic("x", p=[1, 2])


def _t(tid, med, smem=None, status="ok"):
    return Trial("p", 1, tid, "f", "{}", "d", "l", status, median_us=med, smem_model=smem)


def test_winner_needs_margin_over_default():
    assert choose([_t("def", 100.0), _t("a", 98.0)], "def").tactic_id == "def"     # 2% < 3%
    assert choose([_t("def", 100.0), _t("a", 96.0)], "def").tactic_id == "a"
    assert choose([_t("def", 100.0), _t("a", 50.0, status="failed")], "def").tactic_id == "def"
    assert choose([_t("a", 10.0)], "missing-default").tactic_id == "a"
    assert choose([], "def") is None


def test_winner_ties_are_deterministic():
    trials = [_t("def", 100.0), _t("b", 50.2, smem=4096), _t("a", 50.0, smem=8192), _t("c", 50.1, smem=4096)]
    for order in (trials, trials[::-1], trials[1:] + trials[:1]):
        assert choose(order, "def").tactic_id == "b"   # within 1%: smaller smem, then smaller id


def test_whatever_the_rule_picks_is_a_contender():
    """core.winner.contenders (what the search replays) holds choose's pick for any smem tie-break
    and margin it is asked for, and leaves out a default every tied tactic beats by the margin."""
    rng = random.Random(7)
    for _ in range(400):
        trials = [_t(f"t{i}", rng.choice([100.0, 100.5, 101.0, 102.0, 104.0, 110.0]) * rng.uniform(0.99, 1.01),
                     smem=rng.choice([None, 4096, 8192])) for i in range(rng.randint(1, 6))]
        for margin in (0.0, 0.03, 0.2):
            ids = {t.tactic_id for t in contenders(trials, "t0", margin)}
            assert choose(trials, "t0", margin).tactic_id in ids
    far = [_t("def", 100.0), _t("a", 90.0), _t("b", 90.5)]
    assert {t.tactic_id for t in contenders(far, "def")} == {"a", "b"}
    assert {t.tactic_id for t in contenders(far, "def", margin=0.2)} == {"a", "b", "def"}


def test_verdict_helpers():
    v = Verdict.reject("smem 118784 > 101376", 118784, 101376)
    assert v.rejected and v.smem_bytes == 118784
    assert not Verdict.keep().rejected and Verdict(None, "unknown").ok is None
