"""The `autotune` command, run as a real subprocess."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


from helpers import run_cli as autotune


def test_models_and_archs():
    r = autotune("models")
    assert r.returncode == 0 and "glm5" in r.stdout.split() and "gpt-oss-120b" in r.stdout.split()
    r = autotune("archs")
    assert r.returncode == 0
    sm120 = next(l for l in r.stdout.splitlines() if l.startswith("sm120"))
    assert "101376" in sm120 and "native" in sm120


def test_unknown_model_exits_2_and_lists_known(tmp_path):
    r = autotune("search", "--model", "glm9", "--dry-run", cache=tmp_path / "c.db")
    assert r.returncode == 2
    assert "glm9" in r.stderr and "glm5" in r.stderr and "deepseek-v3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c.db").exists()


def test_malformed_config_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                               "num_hidden_layers": 2, "intermediate_size": 1024,
                               "num_attention_heads": 8, "num_key_value_heads": 8}))
    r = autotune("search", "--model", bad, "--max-tokens", "2", cache=tmp_path / "c.db")
    assert r.returncode == 2 and "hidden_size" in r.stderr
    assert not (tmp_path / "c.db").exists()
    bad.write_text("{not json")
    r = autotune("search", "--model", bad, "--max-tokens", "2", cache=tmp_path / "c.db")
    assert r.returncode == 2 and "config.json" in r.stderr
    assert not (tmp_path / "c.db").exists()


def test_unwritable_cache_fails_before_measuring(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = blocker / "sub" / "cache.db"       # a path under a regular file can never be created
    r = autotune("search", "--model", "glm5", "--tp", "8", "--max-tokens", "1", "--cache", target)
    assert r.returncode == 2 and "cache" in r.stderr.lower()
    assert "measured" not in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("args, needle", [
    (["--tp", "0"], "tp"),
    (["--tp", "7"], "7"),
    (["--buckets", "1,x"], "'x'"),
    (["--buckets", "0,2"], "0"),
    (["--arch", "sm70"], "sm70"),
    (["--families", "nope"], "nope"),
    (["--margin", "1.5"], "margin"),
    (["--only", "no_such_layer"], "no_such_layer"),
])
def test_bad_search_input_exits_2_and_writes_nothing(tmp_path, args, needle):
    r = autotune("search", "--model", "glm5", *args, cache=tmp_path / "c.db")
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr
    assert not (tmp_path / "c.db").exists()


def test_only_narrows_the_problems(tmp_path):
    r = autotune("search", "--model", "glm5", "--tp", "8", "--only", "grouped_moe", "--dry-run", cache=tmp_path / "c.db")
    assert r.returncode == 0, r.stderr
    keys = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(("dense:", "grouped_moe:"))]
    # with --only the fused forms (what FP4MoE runs) are candidates too; --no-fused-moe drops them.
    # 4 routed (e256:top8) + the same 4 with the shared expert folded in (e257:top9, --fold-shared by default)
    assert len(keys) == 8 and all(k.startswith("grouped_moe:") for k in keys)
    assert sorted(k.rsplit(":", 1)[1] for k in keys) == ["reduce", "reduce", "swiglu", "swiglu",
                                                         "top8", "top8", "top9", "top9"]
    r = autotune("search", "--model", "glm5", "--tp", "8", "--only", "grouped_moe", "--no-fused-moe", "--dry-run",
                 cache=tmp_path / "c.db")
    assert r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines()
                                  if ln.startswith("grouped_moe:")] == [k for k in keys if k.endswith(("top8", "top9"))]
    r = autotune("search", "--model", "glm5", "--tp", "8", "--only", "down_proj", "--dry-run", cache=tmp_path / "c.db")
    assert r.returncode == 0 and "mlp.down_proj" in r.stdout and "grouped_moe:" not in r.stdout


def test_dry_run_for_sm120_prints_verdicts_with_reasons(tmp_path):
    r = autotune("search", "--model", "glm5", "--tp", "8", "--arch", "sm120", "--dry-run", cache=tmp_path / "c.db")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # the fused forms FP4MoE and FP4MLP serve are searched by default (#26): 4 dense + 2 dense
    # SwiGLU gate_up + 2 plain grouped + 2 fused grouped, + those 4 grouped with the shared expert
    # folded in (e257:top9, --fold-shared by default)
    assert sum(l.startswith("dense:") or l.startswith("grouped_moe:") for l in lines) == 14
    tri = [l for l in lines if "sm120: triton:" in l]
    assert tri and all("kept" in l for l in tri)
    assert any("rejected" in l and "> 101376" in l for l in tri)
    assert not (tmp_path / "c.db").exists()
    j = json.loads(autotune("search", "--model", "glm5", "--tp", "8", "--arch", "sm120", "--dry-run", "--json").stdout)
    assert j["arch"] == "sm120" and len(j["problems"]) == 14          # 10 + 4 with the shared expert folded in
    # every family by default: the cutlass and cuda verdicts for sm120 are in the plan too
    assert {f["family"] for pr in j["problems"] for f in pr["families"]} >= {"triton", "torch", "cutlass", "cuda"}


# ---- #14 CLI edges: each answered in one line with exit 2, nothing written ----------------------

def _one_line_error(r, *needles):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_sizes_past_int32_are_refused_before_measuring(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                               "hidden_size": 10**21, "intermediate_size": 1024, "num_attention_heads": 8,
                               "num_key_value_heads": 8}))
    _one_line_error(autotune("search", "--model", cfg, "--families", "torch", cache=tmp_path / "c.db"), "hidden_size")
    r = autotune("search", "--model", "glm5", "--tp", "8", "--buckets", "99999999999999999999", "--families", "torch",
                 cache=tmp_path / "c.db")
    _one_line_error(r, "99999999999999999999")
    assert not (tmp_path / "c.db").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_gpus_without_a_gpu_is_an_error(tmp_path):
    r = autotune("search", "--model", "glm5", "--tp", "8", "--gpus", "0,1", "--max-tokens", "1", "--families", "torch",
                 cache=tmp_path / "c.db")
    _one_line_error(r, "--gpus", "no CUDA GPU")
    assert not (tmp_path / "c.db").exists()


@pytest.mark.parametrize("args, needle", [
    (["--workers", "0"], "--workers"),
    (["--timeout-s", "0"], "--timeout-s"),
    (["--compile-workers", "0"], "--compile-workers"),
    (["--budget-s", "0"], "--budget-s"),
    (["--buckets", ""], "--buckets is empty"),
    (["--buckets", " "], "--buckets is empty"),
    (["--gpus", ","], "--gpus"),
])
def test_bad_settings_answer_in_one_line_without_a_dump(tmp_path, args, needle):
    # bounded (one bucket, one problem) in case a check were missing and a search ran
    r = autotune("search", "--model", "glm5", "--tp", "8", "--families", "torch", "--only", "mlp.down_proj",
                 "--max-tokens", "1", *args, cache=tmp_path / "c.db", timeout=300)
    _one_line_error(r, needle)
    assert "Runner(" not in r.stderr
    assert not (tmp_path / "c.db").exists()


def test_model_from_a_device_file_does_not_hang(tmp_path):
    _one_line_error(autotune("search", "--model", "/dev/zero", "--dry-run", timeout=120), "/dev/zero")


def test_buckets_above_max_tokens_are_named_and_explicit_buckets_are_kept():
    from autotune import api
    assert api.parse_buckets("1,100000") == (api.Buckets((1, 100000)), None)      # --buckets alone: as given
    b, note = api.parse_buckets("1,100000", 8192)
    assert b.values == (1,) and "100000" in note and "8192" in note
    r = autotune("search", "--model", "glm5", "--tp", "8", "--arch", "sm120", "--dry-run", "--buckets", "1,100000",
                 "--max-tokens", "8192")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "buckets above --max-tokens 8192 dropped: 100000"


def test_archs_cites_files_that_exist():
    import re
    r = autotune("archs", "--help")
    cited = re.findall(r"[\w./-]+\.(?:py|md)", r.stdout)
    assert cited and all((ROOT / c).is_file() for c in cited), cited


def test_every_option_of_every_command_has_help():
    import click
    from autotune.cli import main

    def commands(group, prefix=""):
        for name, cmd in group.commands.items():
            yield prefix + name, cmd
            if isinstance(cmd, click.Group):
                yield from commands(cmd, prefix + name + " ")

    missing = [f"{name} {p.opts[0]}" for name, cmd in commands(main) for p in cmd.params
               if isinstance(p, click.Option) and not p.help]
    assert not missing, missing
