"""`autotune verify`: a model's layers served from a cache as an engine serves them (a Dispatcher
with the runtime's defaults, each weight bound once, each rung's launcher called as the layers call
it), eagerly and under a recorded-call replay with inputs refreshed in place, each row against
float64; one line per distinct problem; exit 1 on any failure. CPU: the torch family, the
`stalecache` test family (wrong only under replay) and the cuda family's CPU runner."""
from __future__ import annotations

import json

import pytest

from helpers import keyed, run_cli
from autotune import api
from autotune.cache import Store
from autotune.core.env import cpu
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.engine import timing

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 1000}
TINY_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "intermediate_size": 512,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 1000}


def config(tmp_path, cfg) -> str:
    d = tmp_path / cfg["model_type"]
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d / "config.json")


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A tiny dense and a tiny MoE model searched with the torch family at M = 1, 4 (one cache)."""
    tmp = tmp_path_factory.mktemp("verify")
    cache = tmp / "c.db"
    dense, moe = config(tmp, TINY), config(tmp, TINY_MOE)
    for cfg in (dense, moe):
        api.search(cfg, buckets=(1, 4), cache=str(cache), families="torch", timer=FAST)
    return cache, dense, moe


def test_every_problem_of_the_model_passes_eager_and_replayed(searched):
    cache, dense, moe = searched
    for cfg in (dense, moe):
        got = api.verify(cfg, str(cache))
        keys = {u.problem.key for u in api.model_problems(cfg, include_attention=True, fused_moe=True,
                                                            fold_shared=True, fused_mlp=True)}
        assert {v.problem for v in got} == keys and len(got) == len(keys)
        assert all(v.ok and v.max_row_err < 2e-2 for v in got), [v.line() for v in got]
        assert any(v.ms == (1, 4) and v.winners == 2 == v.replay_checked for v in got)
        assert all(v.line().startswith("PASS  ") for v in got)
    one = api.verify(moe, str(cache), one_copy_upto=4)        # one copy, as an engine that needs it binds
    assert all(v.ok for v in one)


def test_the_cli_prints_a_line_per_problem_and_exits_0(searched):
    cache, dense, _ = searched
    r = run_cli("verify", "--model", dense, "--cache", cache, "--m", "1,3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    n = len(api.model_problems(dense, include_attention=True, fused_moe=True, fold_shared=True, fused_mlp=True))
    assert len(lines) == n + 1 and lines[-1] == f"{n} of {n} problems pass"
    assert all("max row err" in x and "replay-checked" in x for x in lines[:-1])
    bad = run_cli("verify", "--model", dense, "--cache", cache, "--m", "1,x")
    assert bad.returncode == 2 and "--m" in bad.stderr


def test_a_winner_wrong_only_under_replay_fails_verify(tmp_path, register_family):
    """A cache whose winner is the stalecache family's stale member (stored by hand, not
    replay-checked): verify fails that problem, names the replay, marks the winner, exits 1."""
    fam = register_family("stalecache", "tests.families.stalecache:StaleCacheFamily")
    cfg = config(tmp_path, TINY)
    uses = api.model_problems(cfg, include_attention=True, fused_moe=True, fold_shared=True, fused_mlp=True)
    p = next(u.problem for u in uses if fam.supports(u.problem) is None and u.problem.epilogue == "none")
    stale = Tactic("stalecache", mode="stale")
    lib = CPU.lib_key(fam.depends_on)
    with Store(tmp_path / "c.db") as s:
        for b in (1, 4):
            s.put_winner(keyed(Winner(p.key, b, CPU.device_key, stale.id, "stalecache", stale.to_json(), lib,
                                      1.0, stale.id, 1.0, 1.0)))
    got = {v.problem: v for v in api.verify(cfg, str(tmp_path / "c.db"))}
    v = got[p.key]
    assert not v.ok and "replay" in v.why and "largest row relative error" in v.why
    assert v.winners == 2 and v.replay_checked == 0 and "(not replay-checked" in v.line()
    assert v.line().startswith("FAIL  ")
    from click.testing import CliRunner
    from autotune.cli import main
    r = CliRunner().invoke(main, ["verify", "--model", cfg, "--cache", str(tmp_path / "c.db"), "--m", "1,4"])
    assert r.exit_code == 1 and f"FAIL  {p.key}" in r.output and "FAIL" in r.output.splitlines()[-1]


def test_show_marks_winners_that_are_not_replay_checked(tmp_path, register_family):
    fam = register_family("stalecache", "tests.families.stalecache:StaleCacheFamily")
    from autotune.core.problem import Problem
    p = Problem.dense(256, 512)
    lib = CPU.lib_key(fam.depends_on)
    t = Tactic("stalecache", mode="fresh")
    with Store(tmp_path / "c.db") as s:
        s.put_winner(keyed(Winner(p.key, 1, CPU.device_key, t.id, "stalecache", t.to_json(), lib, 1.0, t.id, 1.0, 1.0)))
        s.put_winner(keyed(Winner(p.key, 4, CPU.device_key, t.id, "stalecache", t.to_json(), lib, 1.0, t.id, 1.0, 1.0,
                                  replay_checked=True)))
    r = run_cli("show", "--cache", tmp_path / "c.db")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "1 winner(s) not replay-checked" in flat and flat.count("(not replay-checked)") >= 1
    j = run_cli("show", "--json", "--cache", tmp_path / "c.db")
    assert sorted(w["replay_checked"] for w in json.loads(j.stdout)) == [False, True]


@pytest.mark.gpu
def test_verify_on_the_gpu_replays_real_cuda_graphs(tmp_path):
    """The same on a GPU: the default families searched at M = 1, 4, then every problem served
    eagerly and from a real CUDA graph replayed with refreshed inputs, each row against float64."""
    cfg = config(tmp_path, TINY_MOE)
    api.search(cfg, buckets=(1, 4), cache=str(tmp_path / "c.db"), timer=FAST)
    for policy in ({}, {"one_copy_upto": 4}):
        got = api.verify(cfg, str(tmp_path / "c.db"), **policy)
        assert got and all(v.ok for v in got), [v.line() for v in got]
        assert all(v.replay_checked == v.winners for v in got)     # this search replay-checked every winner
