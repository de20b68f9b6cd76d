"""autotune.models: presets, HF config.json parsing, TP/EP sharding, dedup, validation."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autotune.models import ModelError, ProblemUse, list_models, problems_for
from autotune.core.problem import Problem

CONFIGS = Path(__file__).parent / "data" / "configs"
GLM5_DIR = CONFIGS / "glm5-nvfp4"

PRESETS = ["glm5", "deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b", "gpt-oss-120b",
           "llama-3.1-70b", "llama-3.1-8b"]


def D(k, n, fmt="nvfp4"):
    """Dense problem from models.md's K×N order."""
    return Problem.dense(n, k, w_fmt=fmt)


def M(k, n, e, top_k, fmt="nvfp4"):
    return Problem.moe(n, k, experts=e, top_k=top_k, w_fmt=fmt)


def pset(uses):
    return {u.problem for u in uses}


def by_problem(uses):
    return {u.problem: u for u in uses}


def write_config(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def glm5_cfg():
    return json.loads((GLM5_DIR / "config.json").read_text())


# --- presets ------------------------------------------------------------------------------------

def test_list_models():
    assert list_models() == PRESETS


@pytest.mark.parametrize("model", PRESETS)
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("attn", [False, True])
def test_every_preset_builds(model, tp, attn):
    uses = problems_for(model, tp=tp, include_attention=attn)
    assert uses and all(isinstance(u, ProblemUse) for u in uses)
    probs = [u.problem for u in uses]
    assert probs == sorted(probs) and len(set(probs)) == len(probs)     # deterministic, deduplicated
    for u in uses:
        assert u.problem.a_fmt == "bf16" and u.problem.out_dtype == "bf16"
        assert u.per_forward > 0 and u.layers
    assert problems_for(model, tp=tp, include_attention=attn) == uses


def test_glm5_tp8_exact():
    uses = problems_for("glm5", tp=8)
    assert pset(uses) == {D(6144, 3072), D(1536, 6144), D(6144, 512), D(256, 6144),
                          M(6144, 512, 256, 8), M(256, 6144, 256, 8)}
    u = by_problem(uses)
    assert u[Problem.dense(3072, 6144)].per_forward == 3
    assert u[Problem.dense(3072, 6144)].layers == ("mlp.gate_up_proj[0-2]",)
    assert u[Problem.dense(6144, 1536)].per_forward == 3
    assert u[Problem.dense(512, 6144)].per_forward == 75
    assert u[Problem.dense(6144, 256)].layers == ("mlp.shared_experts.down_proj[3-77]",)
    assert u[Problem.moe(512, 6144, experts=256, top_k=8)].per_forward == 75
    assert u[Problem.moe(512, 6144, experts=256, top_k=8)].layers == ("mlp.experts.w13[3-77]",)
    assert u[Problem.moe(6144, 256, experts=256, top_k=8)].per_forward == 75


def test_glm5_tp1_tp4():
    tp1 = {(u.problem.k, u.problem.n) for u in problems_for("glm5", tp=1)}
    assert tp1 == {(6144, 24576), (12288, 6144), (6144, 4096), (2048, 6144)}
    tp4 = {(u.problem.k, u.problem.n) for u in problems_for("glm5", tp=4)}
    assert tp4 == {(6144, 6144), (3072, 6144), (6144, 1024), (512, 6144)}


def test_glm5_ep8():
    uses = problems_for("glm5", tp=8, ep=8)
    moe = {u.problem for u in uses if u.problem.kind == "grouped_moe"}
    assert moe == {M(6144, 4096, 32, 8), M(2048, 6144, 32, 8)}
    # dense MLP and shared experts stay TP-sharded over tp
    assert {u.problem for u in uses if u.problem.kind == "dense"} == {D(6144, 3072), D(1536, 6144),
                                                                       D(6144, 512), D(256, 6144)}
    # partial EP: moe_tp = tp // ep
    moe = {u.problem for u in problems_for("glm5", tp=8, ep=2) if u.problem.kind == "grouped_moe"}
    assert moe == {M(6144, 1024, 128, 8), M(512, 6144, 128, 8)}


@pytest.mark.parametrize("model, expected", [
    ("deepseek-v3", {D(16384 // 8, 7168), D(7168, 4608), D(2304, 7168), D(7168, 512), D(256, 7168),
                     M(7168, 512, 256, 8), M(256, 7168, 256, 8)}),
    ("kimi-k2", {M(7168, 512, 384, 8), M(256, 7168, 384, 8)}),
    ("qwen3-235b-a22b", {D(4096, 1280), D(1024, 4096), M(4096, 384, 128, 8), M(192, 4096, 128, 8)}),
    ("qwen3-30b-a3b", {D(2048, 768), D(512, 2048), M(2048, 192, 128, 8), M(96, 2048, 128, 8)}),
    # 90 MX blocks over 8 ranks: 12 each (384), the last rank 6 (192): both shapes are served
    ("gpt-oss-120b", {M(2880, 768, 128, 4, "mxfp4"), M(384, 2880, 128, 4, "mxfp4"),
                      M(2880, 384, 128, 4, "mxfp4"), M(192, 2880, 128, 4, "mxfp4")}),
    ("llama-3.1-70b", {D(8192, 1280), D(1024, 8192), D(8192, 7168), D(3584, 8192)}),
    ("llama-3.1-8b", {D(4096, 768), D(512, 4096), D(4096, 3584), D(1792, 4096)}),
])
def test_tp8_numbers(model, expected):
    assert pset(problems_for(model, tp=8)) == expected


def test_gpt_oss_mx_block_sharding():
    assert pset(problems_for("gpt-oss-120b")) == {M(2880, 5760, 128, 4, "mxfp4"), M(2880, 2880, 128, 4, "mxfp4")}
    # 90 MX blocks over 4 ranks: cdiv(90, 4) * 32 = 736, the last rank 21 blocks (672): both planned
    assert pset(problems_for("gpt-oss-120b", tp=4)) == {M(2880, 1472, 128, 4, "mxfp4"),
                                                        M(736, 2880, 128, 4, "mxfp4"),
                                                        M(2880, 1344, 128, 4, "mxfp4"),
                                                        M(672, 2880, 128, 4, "mxfp4")}
    assert pset(problems_for("gpt-oss-120b", tp=8, ep=8)) == {M(2880, 5760, 16, 4, "mxfp4"),
                                                              M(2880, 2880, 16, 4, "mxfp4")}
    assert {u.per_forward for u in problems_for("gpt-oss-120b", tp=8)} == {36}


def test_preset_name_normalized():
    assert problems_for("GLM5", tp=8) == problems_for("glm5", tp=8)
    assert problems_for("qwen3_30b_a3b") == problems_for("qwen3-30b-a3b")


# --- include_attention ----------------------------------------------------------------------------

def test_include_attention_adds_problems():
    base = problems_for("glm5", tp=8)
    full = problems_for("glm5", tp=8, include_attention=True)
    assert pset(base) < pset(full)
    added = pset(full) - pset(base)
    assert added == {D(6144, 2624), D(2048, 2048), D(512, 3584), D(2048, 6144), D(2048, 4096), D(6144, 160)}
    assert all(p.w_fmt == "nvfp4" for p in added)
    u = by_problem(full)
    assert u[D(2048, 6144)].layers == ("self_attn.o_proj[0-77]",) and u[D(2048, 6144)].per_forward == 78
    # no lm_head (6144×19360) and no router (6144×256)
    assert D(6144, 19360) not in pset(full) and D(6144, 256) not in pset(full)


def test_include_attention_keeps_model_format():
    full = problems_for("gpt-oss-120b", tp=8, include_attention=True)
    assert {u.problem.w_fmt for u in full} == {"mxfp4"}
    assert {D(2880, 640, "mxfp4"), D(512, 2880, "mxfp4")} <= pset(full)   # qkv (8+2·1 heads ×64), o


def test_include_attention_noop_when_attention_quantized():
    assert pset(problems_for("llama-3.1-8b", tp=8, include_attention=True)) == pset(problems_for("llama-3.1-8b", tp=8))


# --- dedup ----------------------------------------------------------------------------------------

def test_dedup_merges_layers(tmp_path):
    cfg = glm5_cfg()
    cfg["intermediate_size"] = 2048            # dense MLP == one shared expert (2048) → same shapes
    uses = problems_for(write_config(tmp_path, cfg), tp=8)
    u = by_problem(uses)
    gate_up = u[D(6144, 512)]
    assert gate_up.layers == ("mlp.gate_up_proj[0-2]", "mlp.shared_experts.gate_up_proj[3-77]")
    assert gate_up.per_forward == 78
    assert u[D(256, 6144)].per_forward == 78
    assert len(uses) == 4


def test_layer_ranges_with_gaps(tmp_path):
    cfg = glm5_cfg()
    cfg["quantization_config"]["exclude_modules"].append("model.layers.1.mlp*")
    u = by_problem(problems_for(write_config(tmp_path, cfg), tp=8))
    assert u[D(6144, 3072)].layers == ("mlp.gate_up_proj[0,2]",) and u[D(6144, 3072)].per_forward == 2


# --- HF config.json ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(tp=1), dict(tp=8), dict(tp=8, ep=8), dict(tp=8, include_attention=True)])
def test_glm5_config_matches_preset(kw):
    preset = problems_for("glm5", **kw)
    assert problems_for(GLM5_DIR, **kw) == preset
    assert problems_for(str(GLM5_DIR / "config.json"), **kw) == preset


def test_config_without_quantization_uses_default_rule():
    assert problems_for(CONFIGS / "llama-3.1-8b", tp=8) == problems_for("llama-3.1-8b", tp=8)
    assert problems_for(str(CONFIGS / "llama-3.1-8b" / "config.json")) == problems_for("llama-3.1-8b")


def test_gpt_oss_config_mxfp4():
    assert problems_for(CONFIGS / "gpt-oss-120b", tp=8) == problems_for("gpt-oss-120b", tp=8)


def test_glm51_style_exclusions_routed_only(tmp_path):
    cfg = glm5_cfg()
    cfg["quantization_config"]["exclude_modules"] += ["model.layers.0*", "model.layers.1.*", "model.layers.2.mlp*",
                                                      "*mlp.shared_experts*"]
    assert pset(problems_for(write_config(tmp_path, cfg), tp=8)) == {M(6144, 512, 256, 8), M(256, 6144, 256, 8)}


def test_hf_quant_config_sidecar(tmp_path):
    cfg = glm5_cfg()
    del cfg["quantization_config"]
    write_config(tmp_path, cfg)
    write_config(tmp_path, {"producer": {"name": "modelopt"},
                            "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "*self_attn*"]}},
                 "hf_quant_config.json")
    assert problems_for(tmp_path, tp=8) == problems_for("glm5", tp=8)


def test_compressed_tensors_regex_ignore(tmp_path):
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
           "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
           "decoder_sparse_step": 1, "mlp_only_layers": [],
           "quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                   "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float",
                                                                             "group_size": 16}, "targets": ["Linear"]}},
                                   "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*"]}}
    assert pset(problems_for(write_config(tmp_path, cfg), tp=8)) == {M(2048, 192, 128, 8), M(96, 2048, 128, 8)}
    cfg["quantization_config"]["ignore"] = ["lm_head", "re:.*mlp.gate$"]
    assert problems_for(write_config(tmp_path, cfg), tp=8) == problems_for("qwen3-30b-a3b", tp=8)


def test_non_fp4_quantization_falls_back_with_warning(tmp_path):
    cfg = glm5_cfg()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    with pytest.warns(UserWarning, match="not NVFP4/MXFP4"):
        uses = problems_for(write_config(tmp_path, cfg), tp=8)
    assert uses == problems_for("glm5", tp=8)


def test_kimi_model_type_default_rule(tmp_path):
    cfg = glm5_cfg()
    del cfg["quantization_config"]
    cfg.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
               num_hidden_layers=61, num_attention_heads=64, intermediate_size=18432, n_routed_experts=384,
               first_k_dense_replace=1, q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128,
               num_nextn_predict_layers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert problems_for(write_config(tmp_path, cfg), tp=8) == problems_for("kimi-k2", tp=8)
    assert problems_for(write_config(tmp_path, cfg), tp=8, include_attention=True) \
        == problems_for("kimi-k2", tp=8, include_attention=True)


# --- errors -------------------------------------------------------------------------------------------

def test_unknown_preset_lists_presets():
    with pytest.raises(ModelError, match="unknown model 'glm-6'") as e:
        problems_for("glm-6")
    assert all(p in str(e.value) for p in PRESETS) and "\n" not in str(e.value)


def test_malformed_json():
    with pytest.raises(ModelError, match="not valid JSON"):
        problems_for(CONFIGS / "malformed")


def test_missing_field():
    with pytest.raises(ModelError, match=r"config\.json: missing field 'hidden_size'"):
        problems_for(CONFIGS / "missing-field" / "config.json")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        problems_for(tmp_path)


@pytest.mark.parametrize("field, value, msg", [
    ("hidden_size", 0, "field 'hidden_size' must be a positive integer, got 0"),
    ("num_hidden_layers", -78, "field 'num_hidden_layers' must be a positive integer, got -78"),
    ("n_routed_experts", "256", "field 'n_routed_experts' must be a non-negative integer, got '256'"),
    ("moe_intermediate_size", 2048.0, "field 'moe_intermediate_size' must be a positive integer, got 2048.0"),
    ("num_experts_per_tok", True, "field 'num_experts_per_tok' must be a positive integer, got True"),
    ("kv_lora_rank", None, "field 'kv_lora_rank' must be a positive integer, got null"),
    ("model_type", 5, "field 'model_type' must be a string"),
])
def test_bad_field(tmp_path, field, value, msg):
    cfg = glm5_cfg()
    cfg[field] = value
    with pytest.raises(ModelError, match=msg):
        problems_for(write_config(tmp_path, cfg))


def test_bad_configs(tmp_path):
    with pytest.raises(ModelError, match="top level must be a JSON object"):
        problems_for(write_config(tmp_path, [1, 2]))
    with pytest.raises(ModelError, match="unsupported model_type 'mistral'"):
        problems_for(write_config(tmp_path, {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ModelError, match="missing field 'model_type'"):
        problems_for(write_config(tmp_path, {"hidden_size": 4096}))
    cfg = glm5_cfg()
    cfg["quantization_config"]["ignore"] = "lm_head"
    with pytest.raises(ModelError, match="'quantization_config.ignore' must be a list of strings"):
        problems_for(write_config(tmp_path, cfg))
    cfg = glm5_cfg()
    cfg["quantization_config"]["exclude_modules"].append("model.layers.0.mlp.up_proj")
    with pytest.raises(ModelError, match="only partly excluded"):
        problems_for(write_config(tmp_path, cfg))


@pytest.mark.parametrize("kw, msg", [
    (dict(tp=0), "tp must be a positive integer, got 0"),
    (dict(tp=-8), "tp must be a positive integer, got -8"),
    (dict(tp="8"), "tp must be a positive integer, got '8'"),
    (dict(tp=8, ep=0), "ep must be a positive integer, got 0"),
    (dict(tp=5), "intermediate_size=12288 is not divisible by tp=5"),
    (dict(tp=3), "shared intermediate=2048 is not divisible by tp=3"),
    (dict(tp=6, ep=3), "routed experts=256 is not divisible by ep=3"),
    (dict(tp=4, ep=8), "tp=4 is not a multiple of ep=8"),
    (dict(tp=3, include_attention=True), "num_attention_heads=64 is not divisible by tp=3"),
])
def test_bad_parallelism_glm5(kw, msg):
    with pytest.raises(ModelError, match=msg) as e:
        problems_for("glm5", **kw)
    assert "\n" not in str(e.value)


def test_ep_without_experts():
    with pytest.raises(ModelError, match="ep=8 given but llama-3.1-8b has no routed experts"):
        problems_for("llama-3.1-8b", tp=8, ep=8)


def test_shard_not_multiple_of_block():
    # qwen3-30b w2 at tp=32: K = 768/32 = 24, not a multiple of the NVFP4 block (16)
    with pytest.raises(ModelError, match=r"qwen3-30b-a3b mlp\.experts\.w2: K=24 is not a multiple of the nvfp4 block"):
        problems_for("qwen3-30b-a3b", tp=32)


def test_kv_heads_must_divide_tp():
    with pytest.raises(ModelError, match="tp=12 is not divisible by num_key_value_heads=8"):
        problems_for("llama-3.1-8b", tp=12)      # 32 q heads % 12 fails later; kv check comes first


def test_config_reads_are_bounded_and_sizes_past_int32_refused(tmp_path):
    """#14: `--model /dev/zero` hung reading forever; a hidden_size of 1e21 ended in an
    OverflowError from the cache. Both are one-line ModelErrors now."""
    from autotune.models import load_model
    with pytest.raises(ModelError, match="not a regular file"):
        load_model("/dev/zero")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                                "hidden_size": 10**21, "intermediate_size": 1024, "num_attention_heads": 8,
                                "num_key_value_heads": 8}))
    with pytest.raises(ModelError, match="'hidden_size' = 1000000000000000000000 is larger than 2147483647"):
        load_model(cfg)
    big = tmp_path / "big" / "config.json"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)     # sparse: no 16 MiB written
    with pytest.raises(ModelError, match="larger than 16 MiB"):
        load_model(big)
