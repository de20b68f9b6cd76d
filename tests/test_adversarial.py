"""Issue 45 item 6: every case of the adversarial pass on f4cc350 answers with one line and a
non-zero exit (or a clear exception), or a correct result; bounded in time and memory."""
from __future__ import annotations

import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from autotune import api
from autotune.cache import CacheError, Store
from autotune.core import codekey
from autotune.core.arch import ARCHS
from autotune.core.buckets import MAX_CAPTURE, Buckets
from autotune.core.checkpoint import Checkpoint, CheckpointError
from autotune.core.checkpoint_moe import read_experts
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.models import ModelError, load_model
from autotune.runtime.dispatch import Dispatcher
from tests.helpers import run_cli
from tests.test_cache_bad import one_line_error

DATA = Path(__file__).parent / "data" / "ckpt"
GPTOSS = DATA / "modelopt_gptoss"          # ModelOpt's stacked (bmm) NVFP4 experts
BLK = "model.layers.0.mlp"


# ------------------------------------------------------------- stacked experts' per-expert scales

def _stacked_with(tmp_path: Path, name: str, value) -> Path:
    """The gpt-oss fixture with `name` stored per expert, expert 2's value replaced."""
    d = tmp_path / "ck"
    shutil.copytree(GPTOSS, d)
    idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    shard = d / idx[name]
    ts = load_file(str(shard))
    good = ts[name].float().reshape(())
    per = good.expand(4).clone()
    if isinstance(value, str):                  # an integer tensor, as a broken export writes it
        ts[name] = torch.tensor([1, 1, 1, 1], dtype=torch.int32)
    else:
        per[2] = value
        ts[name] = per
    save_file(ts, str(shard))
    return d


@pytest.mark.parametrize("tensor", ["gate_up_proj_weight_scale_2", "down_proj_weight_scale_2",
                                    "gate_up_proj_input_scale", "down_proj_input_scale"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), 1e30, "int32"])
def test_stacked_per_expert_scales_are_refused_as_the_single_linear_loader_does(tmp_path, tensor, value):
    name = f"{BLK}.experts.{tensor}"
    d = _stacked_with(tmp_path, name, value)
    with Checkpoint.open(d) as ck, pytest.raises(CheckpointError) as e:
        read_experts(ck, BLK)
    msg = str(e.value)
    assert name in msg and "\n" not in msg
    assert ("must be float32" in msg) if value == "int32" else (f"{name}[2]" in msg and "positive finite" in msg)


def test_single_linear_refuses_a_huge_scale_too(tmp_path):
    d = tmp_path / "lin"
    shutil.copytree(DATA / "modelopt_llama", d)
    idx = d / "model.safetensors.index.json"
    wm = json.loads(idx.read_text())["weight_map"] if idx.is_file() else None
    name = next(k for k in (wm or {}) if k.endswith("down_proj.weight_scale_2"))
    shard = d / wm[name]
    ts = load_file(str(shard))
    ts[name] = torch.tensor(1e30)
    save_file(ts, str(shard))
    with Checkpoint.open(d) as ck, pytest.raises(CheckpointError, match=r"= 1e\+30 is not a positive finite scale"):
        ck.linear(name[: -len(".weight_scale_2")])


def test_good_stacked_scales_per_expert_still_load(tmp_path):
    name = f"{BLK}.experts.gate_up_proj_weight_scale_2"
    base = Checkpoint.open(GPTOSS)
    want = read_experts(base, BLK).w13.dequantize(torch.float32)
    d = _stacked_with(tmp_path, name, float(load_file(str(GPTOSS / json.loads(
        (GPTOSS / "model.safetensors.index.json").read_text())["weight_map"][name]))[name]))
    with Checkpoint.open(d) as ck:
        assert torch.equal(read_experts(ck, BLK).w13.dequantize(torch.float32), want)


# ------------------------------------------------------------------- duplicate tensors in shards

def test_duplicate_tensor_names_across_shards_are_refused(tmp_path):
    a = {"model.layers.0.mlp.down_proj.weight": torch.zeros(4, 8, dtype=torch.uint8)}
    save_file(a, str(tmp_path / "model-00001.safetensors"))
    save_file({**a, "other": torch.ones(1)}, str(tmp_path / "model-00002.safetensors"))
    with pytest.raises(CheckpointError, match=r"model-00002\.safetensors: tensor 'model\.layers\.0\.mlp\.down_proj"
                                              r"\.weight' is also in model-00001\.safetensors"):
        Checkpoint.open(tmp_path)


# ------------------------------------------------------------------- sizes bounded before building

def _cfg(tmp_path: Path, **over) -> Path:
    d = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 4, **over}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("field, value, over", [
    ("num_hidden_layers", 2**31 - 16, {}), ("num_hidden_layers", 10**5, {}),
    ("n_routed_experts", 2**31 - 16, {"model_type": "deepseek_v3"}),
    ("num_experts", 10**7, {"model_type": "qwen3_moe"}),
])
def test_counts_are_bounded_before_anything_is_built(tmp_path, field, value, over):
    cfg = _cfg(tmp_path, **{field: value, **over})
    t0 = time.process_time()
    with pytest.raises(ModelError, match=rf"field '{field}' = {value} is more than \d+, the most supported"):
        load_model(cfg)
    assert time.process_time() - t0 < 5          # refused by a comparison, not after building 10^5 layers


def test_cli_dry_run_refuses_a_huge_layer_count_in_one_line(tmp_path):
    r = run_cli("search", "--model", _cfg(tmp_path, num_hidden_layers=2**31 - 16), "--dry-run", "--families", "torch",
                cache=tmp_path / "c.db")
    one_line_error(r, "'num_hidden_layers' = 2147483632 is more than 4096")


@pytest.mark.parametrize("spec", ["vllm:1000000000", "sglang:99999999999", "vllm:" + "9" * 40, "hybrid:99999999999"])
def test_bucket_presets_are_bounded_before_the_list_is_built(spec):
    with pytest.raises(api.BadInput, match="largest supported|the largest M supported"):
        api.parse_buckets(spec)


def test_bucket_presets_at_the_bound_still_build():
    assert max(Buckets.parse(f"vllm:{MAX_CAPTURE}").values) == MAX_CAPTURE
    assert max(Buckets.parse("sglang:512").values) == 512


def test_max_tokens_zero_is_refused(tmp_path):
    with pytest.raises(api.BadInput, match="--max-tokens must be a positive integer, got 0"):
        api.parse_buckets(None, 0)
    with pytest.raises(api.BadInput, match="--max-tokens must be a positive integer, got 0"):
        api.parse_buckets("1,2,4", 0)
    r = run_cli("search", "--model", _cfg(tmp_path), "--dry-run", "--families", "torch", "--max-tokens", "0",
                cache=tmp_path / "c.db")
    one_line_error(r, "--max-tokens must be a positive integer, got 0")


def test_workers_are_capped_by_jobs_and_cores_with_a_warning(tmp_path):
    p = Problem.dense(256, 512)
    with pytest.warns(UserWarning, match=r"--workers 100000 capped at 1: 1 job\(s\)"):
        res = api.run([p], families="torch", buckets="1", workers=100000, dry_run=True, cache=str(tmp_path / "c.db"))
    assert any("--workers 100000 capped at 1" in n for n in res.input_notes)


# --------------------------------------------------------------------------------------- pins

@pytest.mark.parametrize("pin, needle", [
    ('{"*": "torch[chunk_n=7]"}', "torch tactic needs exactly the parameters"),
    ('{"*": "nosuch[a=1]"}', "unknown family 'nosuch'"),
])
def test_a_star_pin_invalid_for_every_problem_raises(tmp_path, monkeypatch, pin, needle):
    monkeypatch.setenv("AUTOTUNE_PIN", pin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=needle):
            Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False, warn=False)


# -------------------------------------------------------------------------------- SQLite URIs

@pytest.mark.parametrize("query", ["?mode=rwc&uri=true", "?mode=rwc", "?timeout=5"])
def test_sqlite_url_parameters_are_refused_by_search_show_and_dispatcher(tmp_path, query):
    url = f"sqlite:///{tmp_path}/new.db{query}"
    with pytest.raises(api.BadInput, match="SQLite URL parameters .* are not supported"):
        api.run([Problem.dense(256, 512)], families="torch", buckets="1", cache=url)
    with pytest.raises(CacheError, match="SQLite URL parameters"):
        Store(url)
    one_line_error(run_cli("show", "--cache", url), "SQLite URL parameters")
    with pytest.warns(UserWarning, match="cache not used .*SQLite URL parameters"):
        Dispatcher(url, env=cpu(), arch=ARCHS["cpu"], record_misses=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []        # nothing written anywhere


# ------------------------------------------------------------------ a top-level module family

def test_a_top_level_module_family_is_keyed_like_a_package(tmp_path, monkeypatch):
    (tmp_path / "fp4_thirdparty_fam.py").write_text("def kernel(x):\n    return x + 1\n")
    (tmp_path / "fp4_thirdparty_fam.cu").write_text("// kernel source\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = codekey.Code.of("fam", "fp4_thirdparty_fam", "fp4_thirdparty_fam",
                           files=(("fp4_thirdparty_fam", "fp4_thirdparty_fam.cu"),))
    assert codekey.module_file("fp4_thirdparty_fam") == tmp_path / "fp4_thirdparty_fam.py"
    k = codekey._digest(code, None)
    assert k == codekey.digest(code, tmp_path)
    edited = tmp_path / "copy"
    edited.mkdir()
    (edited / "fp4_thirdparty_fam.py").write_text("def kernel(x):\n    return x + 2\n")
    (edited / "fp4_thirdparty_fam.cu").write_text("// kernel source\n")
    assert codekey.digest(code, edited) != k        # an edit to its code moves its key
    with pytest.raises(ValueError, match="code key: no module 'fp4_no_such_module'"):
        codekey.module_file("fp4_no_such_module.x")


# ---------------------------------------------------------------------------- damaged schemas

def _damaged(tmp_path: Path) -> Path:
    src = tmp_path / "c.db"
    with Store(src) as s:
        s.devices()
    b = bytearray(src.read_bytes())
    i = b.find(b"CREATE TABLE winners")
    assert i > 0
    b[i + 7] = 0xFF                           # invalid UTF-8 inside the schema text
    out = tmp_path / "damaged.db"
    out.write_bytes(bytes(b))
    return out


def test_a_schema_that_is_not_utf8_is_refused_in_one_line_everywhere(tmp_path):
    bad = _damaged(tmp_path)
    for ro in (True, False):
        with pytest.raises(CacheError, match="its schema is not UTF-8 text"):
            Store(bad, readonly=ro)
    one_line_error(run_cli("show", "--cache", bad), "its schema is not UTF-8 text")
    one_line_error(run_cli("cache", "import", bad, "--cache", tmp_path / "t.db"), "its schema is not UTF-8 text")
    one_line_error(run_cli("cache", "merge", bad, "-o", tmp_path / "m.db"), "its schema is not UTF-8 text")
    assert not (tmp_path / "t.db").exists() and not (tmp_path / "m.db").exists()


# ----------------------------------------------------------------------- deep JSON in checkpoints

@pytest.mark.parametrize("which", ["config.json", "hf_quant_config.json", "model.safetensors.index.json"])
def test_deep_json_in_a_checkpoint_is_refused_in_one_line(tmp_path, which):
    d = tmp_path / "ck"
    shutil.copytree(DATA / "modelopt_qwen3moe", d)
    (d / which).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(d).scheme
    assert f"{which}: JSON nested deeper than" in str(e.value) and "\n" not in str(e.value)


def test_a_star_pin_that_fits_none_of_the_stored_problems_raises(tmp_path, monkeypatch):
    """A valid dense-only tactic pinned for `*` over a cache of grouped-MoE winners would pin
    nothing: the dispatcher refuses it instead of serving the stored winners under an A/B label."""
    from tests.test_dispatch import T_A, make_cache, quiet, win
    tri = ("triton[block_k=128,block_m=64,block_n=64,group_m=8,kernel=w4a16_dequant,num_stages=3,num_warps=4,"
           "split_k=1]")             # docs/serving.md's example: a dense kernel, not a grouped-MoE one
    moe = Problem.moe(256, 512, 8, 2)
    from autotune.core.records import Winner
    w = win(T_A, 4)
    path = make_cache(tmp_path / "m.db", [Winner(moe.key, *[getattr(w, f) for f in list(Winner.__dataclass_fields__)[1:]])])
    monkeypatch.setenv("AUTOTUNE_PIN", json.dumps({"*": tri}))
    with pytest.raises(ValueError, match=r"\* pin triton\[.*\] fits none of the 1 problem\(s\) served"):
        quiet(cache=path)
