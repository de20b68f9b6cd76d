"""Issue 45 item 5: one parser of quantization configs for planning and loading; ModelOpt
W4A16_NVFP4 and MIXED_PRECISION checkpoints; FP4MLP's W4A4; glm4_moe; every TP rank's shapes
planned (uneven splits); gpt-oss's unfused experts; GLM-5 TP8's problem set pinned.

The checkpoints are small real ones derived here from the ModelOpt fixtures under tests/data/ckpt
(tools/make_checkpoint_fixtures.py): tensors rewritten as ModelOpt writes the other algorithms (a
W4A16_NVFP4 export has no input_scale; a MIXED_PRECISION export names each layer's algorithm in
`quantized_layers` and stores its FP8 layers as float8_e4m3fn weight + weight_scale + input_scale)."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from autotune.api import model_problems
from autotune.core.arch import ARCHS
from autotune.core.checkpoint import Checkpoint, CheckpointError
from autotune.core.env import cpu
from autotune.core.quant_config import detect_quant
from autotune.models import load_model
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.layers import FP4MLP
from autotune.runtime.moe import FP4MoE
from autotune.runtime.nn import FP4Linear

DATA = Path(__file__).parent / "data" / "ckpt"
LLAMA = DATA / "modelopt_llama"
ATTN1 = [f"model.layers.1.self_attn.{p}_proj" for p in "qkvo"]
MLPS = [f"model.layers.{i}.mlp.{p}_proj" for i in (0, 1) for p in ("gate", "up", "down")]


from tests.test_mlp import disp, rel  # noqa: F401,E402  (the same empty-cache dispatcher and error)


def _rewrite(src: Path, dst: Path, fn, quant: dict) -> Path:
    """Copy a fixture, pass every shard's tensors through fn(dict) -> dict, and set its ModelOpt
    quantization (hf_quant_config.json's `quantization` and config.json's quantization_config)."""
    shutil.copytree(src, dst)
    idx = json.loads((dst / "model.safetensors.index.json").read_text())
    wm = {}
    for shard in sorted({dst / f for f in idx["weight_map"].values()}):
        ts = fn(load_file(str(shard)))
        save_file(ts, str(shard))
        wm.update({k: shard.name for k in ts})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": idx.get("metadata", {}), "weight_map": wm}))
    hq = json.loads((dst / "hf_quant_config.json").read_text())
    hq["quantization"] = {**{k: v for k, v in hq["quantization"].items() if k != "quant_algo"}, **quant}
    (dst / "hf_quant_config.json").write_text(json.dumps(hq))
    cfg = json.loads((dst / "config.json").read_text())
    if "quantization_config" in cfg:
        cfg["quantization_config"] = {"quant_method": "modelopt", "producer": hq["producer"], **hq["quantization"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _w4a16(tmp_path: Path) -> Path:
    return _rewrite(LLAMA, tmp_path / "w4a16", lambda ts: {k: v for k, v in ts.items() if not k.endswith("input_scale")},
                    {"quant_algo": "W4A16_NVFP4"})


def _to_fp8(ts: dict, module: str) -> None:
    """One NVFP4 module rewritten as ModelOpt's FP8 (per-tensor weight and input scales)."""
    from autotune.core.modelopt import from_modelopt
    w = from_modelopt(ts, module).dequantize(torch.float32)
    scale = w.abs().max() / 448
    for k in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
        ts.pop(f"{module}.{k}", None)
    ts[f"{module}.weight"] = (w / scale).to(torch.float8_e4m3fn)
    ts[f"{module}.weight_scale"] = scale.reshape(()).float()
    ts[f"{module}.input_scale"] = torch.tensor(0.05)


def _mixed(tmp_path: Path) -> Path:
    def fn(ts):
        for m in ATTN1:
            if f"{m}.weight_scale_2" in ts:
                _to_fp8(ts, m)
        return ts
    layers = {m: {"quant_algo": "NVFP4", "group_size": 16} for m in MLPS}
    layers.update({m: {"quant_algo": "FP8"} for m in ATTN1})
    return _rewrite(LLAMA, tmp_path / "mixed", fn, {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers})


# ------------------------------------------------------------------------ W4A16_NVFP4

def test_modelopt_w4a16_loads_weight_only(tmp_path, disp):
    d = _w4a16(tmp_path)
    s = detect_quant(json.loads((d / "config.json").read_text()), json.loads((d / "hf_quant_config.json").read_text()))
    assert (s.producer, s.fmt, s.w4a4) == ("modelopt", "nvfp4", False)
    mod = "model.layers.1.mlp.down_proj"
    with Checkpoint.open(d) as ck, Checkpoint.open(LLAMA) as orig:
        w, o = ck.linear(mod), orig.linear(mod)
        assert w.input_scale is None and torch.equal(w.packed, o.packed) and torch.equal(w.scales.view(torch.uint8),
                                                                                          o.scales.view(torch.uint8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # weight-only: nothing to fall back from
        lin = FP4Linear.from_pretrained(d, mod, dispatcher=disp)
        assert lin.problem.a_fmt == "bf16"
        uses = model_problems(d, arch="sm120")
    assert uses and all(u.problem.a_fmt == "bf16" for u in uses)
    x = torch.randn(3, lin.in_features, dtype=torch.bfloat16)
    ref = x.double() @ o.dequantize(torch.float64).T
    assert rel(lin(x), ref) < 1e-2


# ------------------------------------------------------------------------ MIXED_PRECISION

def test_modelopt_mixed_precision_serves_fp4_layers_and_refuses_the_others(tmp_path, disp):
    d = _mixed(tmp_path)
    with Checkpoint.open(d) as ck, Checkpoint.open(LLAMA) as orig:
        assert ck.scheme.layer_algo(ATTN1[0]) == "FP8" and ck.scheme.layer_algo(MLPS[0]) == "NVFP4"
        assert not ck.is_quantized(ATTN1[0]) and ck.is_quantized(MLPS[0])
        w, o = ck.linear(MLPS[4]), orig.linear(MLPS[4])
        assert torch.equal(w.packed, o.packed) and torch.equal(w.input_scale, o.input_scale)
        with pytest.raises(CheckpointError) as e:
            ck.linear(ATTN1[0])
    msg = str(e.value)
    assert f"{ATTN1[0]} is FP8 in this ModelOpt MIXED_PRECISION checkpoint, not FP4" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="is FP8 .* not FP4"):
        FP4Linear.from_pretrained(d, ATTN1[3], dispatcher=disp)
    FP4Linear.from_pretrained(d, MLPS[5], activations="w4a16", dispatcher=disp)


def test_mixed_precision_plans_only_its_fp4_layers_and_says_so(tmp_path):
    d = _mixed(tmp_path)
    with pytest.warns(UserWarning, match=r"4 layer\(s\) are FP8 in quantized_layers .* neither planned nor served as FP4"):
        uses = model_problems(d, arch="sm90", activations="w4a16")
    layers = {layer for u in uses for layer in u.layers}
    assert layers == {"mlp.gate_up_proj[0-1]", "mlp.down_proj[0-1]"}, layers      # no FP8 attention as NVFP4
    with pytest.warns(UserWarning):
        arch, rule = load_model(d)
    assert rule.w4a4 and not rule.quantized("attn_qkv", tuple(f"model.layers.1.self_attn.{p}_proj" for p in "qkv"), "x")


def test_one_parser_for_planning_and_loading(tmp_path):
    """A config the loaders refuse is not planned as FP4 either (it warns and takes the default
    rule, as for any non-FP4 config); the algorithms the loaders take are planned as they load."""
    from autotune.models.hf_config import parse_config
    base = json.loads((LLAMA / "config.json").read_text())
    for algo, w4a4 in (("NVFP4", True), ("W4A16_NVFP4", False)):
        _, rule = parse_config({**base, "quantization_config": {"quant_method": "modelopt", "quant_algo": algo}},
                               "c.json", "x")
        assert (rule.fmt, rule.w4a4, rule.source) == ("nvfp4", w4a4, "c.json")
    with pytest.warns(UserWarning, match="is not NVFP4/MXFP4 as the loaders read it"):
        _, rule = parse_config({**base, "quantization_config": {"quant_method": "modelopt",
                                                                 "quant_algo": "W4A8_NVFP4_FP8"}}, "c.json", "x")
    assert rule.source != "c.json"


# ------------------------------------------------------------------------ FP4MLP W4A4

def test_fp4mlp_w4a4_as_fp4linear(tmp_path, disp, monkeypatch):
    from autotune.runtime import activations as act
    monkeypatch.setattr(act, "_WARNED", set())           # the fallback warns once per process and arch
    r = load_file(str(DATA / "modelopt_deepseek.ref.safetensors"))
    blk = "model.layers.1.mlp"
    x = r[f"x.{blk}"]
    with pytest.warns(UserWarning, match="has no W4A4 dense tactic: running W4A16"):
        auto = FP4MLP.from_pretrained(DATA / "modelopt_deepseek", f"{blk}.shared_experts", arch="sm90",
                                      dispatcher=disp)
    assert auto.a_fmt == "bf16"
    w4 = FP4MLP.from_pretrained(DATA / "modelopt_deepseek", f"{blk}.shared_experts", activations="w4a4", dispatcher=disp)
    assert w4.a_fmt == "nvfp4" and w4.gate_up.problem.a_fmt == "nvfp4" and w4.down.problem.a_fmt == "nvfp4"
    # the same W4A4 arithmetic as FP4Linear: gate, up and down each as an FP4Linear(a_fmt="nvfp4")
    lin = {p: FP4Linear.from_pretrained(DATA / "modelopt_deepseek", f"{blk}.shared_experts.{p}", activations="w4a4",
                                        dispatcher=disp) for p in ("gate_proj", "up_proj", "down_proj")}
    xb = x.to(torch.bfloat16)
    h = (torch.nn.functional.silu(lin["gate_proj"](xb).float()) * lin["up_proj"](xb).float()).to(torch.bfloat16)
    want = lin["down_proj"](h)
    assert rel(w4(xb), want) < 2e-2
    assert rel(w4(xb), r[f"y.{blk}.shared_experts"]) < 0.3       # W4A4 on inputs calibrated for it
    with pytest.raises(ValueError, match="W4A16 checkpoint"):
        FP4MLP.from_pretrained(_w4a16(tmp_path), "model.layers.0.mlp", activations="w4a4", dispatcher=disp)


# ------------------------------------------------------------------------ glm4_moe

GLM45 = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
         "first_k_dense_replace": 3, "head_dim": 128, "hidden_size": 5120, "intermediate_size": 12288,
         "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160, "n_shared_experts": 1,
         "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 92,
         "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
         "routed_scaling_factor": 2.5, "topk_group": 1, "transformers_version": "5.25.0", "use_qk_norm": False,
         "vocab_size": 151552}


def test_glm45_plans_vllms_tp8_shapes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GLM45))
    uses = model_problems(tmp_path, tp=8, include_attention=True, arch="sm90")
    got = {u.problem.key for u in uses}
    assert got == {"dense:bf16*nvfp4->bf16:n1792:k5120", "dense:bf16*nvfp4->bf16:n5120:k1536",   # qkv 12+2x1 heads; o
                   "dense:bf16*nvfp4->bf16:n3072:k5120",                                        # dense gate_up 0-2
                   "dense:bf16*nvfp4->bf16:n384:k5120", "dense:bf16*nvfp4->bf16:n5120:k192",     # shared expert
                   "grouped_moe:bf16*nvfp4->bf16:n384:k5120:e160:top8",
                   "grouped_moe:bf16*nvfp4->bf16:n5120:k192:e160:top8"}


def test_glm4_moe_checkpoint_plans_and_loads(tmp_path, disp):
    """The DeepSeek ModelOpt fixture's tensors under a glm4_moe config (GLM-4.5 names its MoE block's
    modules as DeepSeek does): planned from its config, its MoE block loaded and equal to the
    producer's output."""
    d = tmp_path / "glm"
    shutil.copytree(DATA / "modelopt_deepseek", d)
    cfg = json.loads((d / "config.json").read_text())
    keep = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                                "n_shared_experts", "num_experts_per_tok", "num_hidden_layers", "first_k_dense_replace",
                                "num_attention_heads", "quantization_config")}
    (d / "config.json").write_text(json.dumps({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                                               "num_key_value_heads": 4, "head_dim": 16, **keep}))
    uses = model_problems(d, arch="sm90", activations="w4a16")
    assert {u.problem.key for u in uses} >= {"grouped_moe:bf16*nvfp4->bf16:n64:k64:e4:top2",
                                             "grouped_moe:bf16*nvfp4->bf16:n64:k32:e4:top2"}
    r, blk = load_file(str(DATA / "modelopt_deepseek.ref.safetensors")), "model.layers.1.mlp"
    x, ids, tw = r[f"x.{blk}"], r[f"ids.{blk}"].to(torch.int32), r[f"tw.{blk}"]
    b = FP4MoE.from_pretrained(d, blk, activations="w4a16", dispatcher=disp)
    assert b.has_shared and b.top_k == 2
    assert rel(b(x, ids, tw), r[f"y.{blk}"]) < 1e-2


# ------------------------------------------------------------------------ every rank, gpt-oss

GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
           "num_experts_per_tok": 2, "intermediate_size": 160,
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                       "model.layers.*.mlp.router"]}}


def test_every_tp_rank_is_planned_and_gpt_oss_is_never_fused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS))
    keys = {u.problem.key for u in model_problems(tmp_path, tp=2, fused_moe=True, fold_shared=True, fused_mlp=True,
                                                  arch="sm90")}
    # 160 = 5 MX blocks: rank 0 holds 3 (96), rank 1 holds 2 (64), vLLM's whole-block split
    assert keys == {"grouped_moe:bf16*mxfp4->bf16:n192:k64:e4:top2", "grouped_moe:bf16*mxfp4->bf16:n64:k96:e4:top2",
                    "grouped_moe:bf16*mxfp4->bf16:n128:k64:e4:top2", "grouped_moe:bf16*mxfp4->bf16:n64:k64:e4:top2"}
    with pytest.raises(Exception, match="5 MX blocks of moe_intermediate_size leave rank 5 of tp/ep=8 no block"):
        model_problems(tmp_path, tp=8, arch="sm90")


# ------------------------------------------------------------------------ GLM-5 TP8 pinned

GLM5_TP8 = [
    "dense:bf16*nvfp4->bf16:n512:k6144", "dense:bf16*nvfp4->bf16:n512:k6144:swiglu",
    "dense:bf16*nvfp4->bf16:n3072:k6144", "dense:bf16*nvfp4->bf16:n3072:k6144:swiglu",
    "dense:bf16*nvfp4->bf16:n6144:k256", "dense:bf16*nvfp4->bf16:n6144:k1536",
    "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8", "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8:swiglu",
    "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9", "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu",
    "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8", "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8:reduce",
    "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9", "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9:reduce",
]


@pytest.mark.parametrize("arch", ["sm90", "sm120"])
def test_glm5_tp8_problem_set_stays_as_it_is(arch):
    uses = model_problems("glm5", tp=8, fused_moe=True, fused_mlp=True, fold_shared=True, arch=arch)
    assert [u.problem.key for u in uses] == GLM5_TP8


# ------------------------------------------------- routed W4A4, shared expert W4A16 (MIXED_PRECISION)

def _deepseek_mixed(tmp_path: Path) -> Path:
    """modelopt_deepseek with its shared experts W4A16_NVFP4 (no input_scale) and everything else
    NVFP4, as a MIXED_PRECISION export names them."""
    wm = json.loads((DATA / "modelopt_deepseek" / "model.safetensors.index.json").read_text())["weight_map"]
    mods = sorted(k[: -len(".weight_scale_2")] for k in wm if k.endswith(".weight_scale_2"))
    layers = {m: {"quant_algo": "W4A16_NVFP4" if ".shared_experts." in m else "NVFP4"} for m in mods}
    drop = lambda ts: {k: v for k, v in ts.items() if not (".shared_experts." in k and k.endswith("input_scale"))}  # noqa: E731
    return _rewrite(DATA / "modelopt_deepseek", tmp_path / "dsmix", drop,
                    {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers})


def test_routed_and_shared_experts_of_different_formats_run_apart_and_say_so(tmp_path, disp):
    d = _deepseek_mixed(tmp_path)
    r, blk = load_file(str(DATA / "modelopt_deepseek.ref.safetensors")), "model.layers.1.mlp"
    x, ids, tw = r[f"x.{blk}"], r[f"ids.{blk}"].to(torch.int32), r[f"tw.{blk}"]
    with pytest.warns(UserWarning, match=r"routed experts are W4A4 and its shared expert W4A16; the shared expert "
                                         r"runs apart \(an FP4MLP, W4A16\)"):
        b = FP4MoE.from_pretrained(d, blk, activations="w4a4", dispatcher=disp)
    assert b.has_shared and not b.shared_folded and b.a_fmt == "nvfp4" and b.shared_mlp.a_fmt == "bf16"
    assert rel(b(x, ids, tw), r[f"y.{blk}"]) < 0.3
    with pytest.raises(ValueError, match="fold_shared=True, but the checkpoint's routed experts are W4A4"):
        FP4MoE.from_pretrained(d, blk, activations="w4a4", dispatcher=disp, fold_shared=True)
    # planned as served: the routed experts W4A4, the shared expert W4A16, nothing folded
    keys = {u.problem.key for u in model_problems(d, arch="sm120", activations="w4a4", fold_shared=True)}
    assert "grouped_moe:nvfp4*nvfp4->bf16:n64:k64:e4:top2" in keys and "dense:bf16*nvfp4->bf16:n64:k64" in keys
    assert not any(":e5:" in k for k in keys), keys
