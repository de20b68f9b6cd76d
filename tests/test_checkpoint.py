"""The checkpoint reader and from_pretrained on checkpoints made by the REAL producers.

tests/data/ckpt/ holds tiny checkpoints written by nvidia-modelopt 0.47.0 (export_hf_checkpoint)
and llmcompressor 0.14.0.1 (oneshot) — tools/make_checkpoint_fixtures.py, run once in a separate
venv; CI never installs them — plus `<name>.ref.safetensors`: the producer's own dequantization
(`deq.*`, bf16) and layer outputs (`y.*` W4A16 / `y4.*` W4A4, float64) for fixed inputs.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from autotune.core.arch import ARCHS, get_arch
from autotune.core.checkpoint import Checkpoint, CheckpointError, MissingTensor, detect_quant
from autotune.core.checkpoint_moe import read_experts
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.runtime import activations as act
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.runtime.nn import FP4Linear

DATA = Path(__file__).parent / "data" / "ckpt"
LINEAR_FIXTURES = ("modelopt_llama", "llmc_llama", "llmc_llama_a16", "llmc_llama_mxfp4")


@pytest.fixture
def disp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False, warn=False)


def refs(name: str) -> dict:
    return load_file(str(DATA / f"{name}.ref.safetensors"))


def rel(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def same_bf16(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical bf16, except the sign of zero: ModelOpt's E2M1 table decodes code 8 (-0) as +0."""
    bits = a.view(torch.int16) == b.view(torch.int16)
    return bool((bits | ((a == 0) & (b == 0))).all()) and a.shape == b.shape


def modules(name: str) -> list[str]:
    return sorted(k[4:] for k in refs(name) if k.startswith("deq.") and ".experts." not in k
                  and "shared_experts" not in k)


# ----------------------------------------------------------------------------- formats recognised

@pytest.mark.parametrize("name, producer, fmt, w4a4", [
    ("modelopt_llama", "modelopt", "nvfp4", True), ("modelopt_qwen3moe", "modelopt", "nvfp4", True),
    ("llmc_llama", "compressed-tensors", "nvfp4", True), ("llmc_llama_a16", "compressed-tensors", "nvfp4", False),
    ("llmc_llama_mxfp4", "compressed-tensors", "mxfp4", False), ("gptoss_mxfp4", "hf-mxfp4", "mxfp4", False)])
def test_scheme_of_each_producer(name, producer, fmt, w4a4):
    s = Checkpoint.open(DATA / name).scheme
    assert (s.producer, s.fmt, s.w4a4) == (producer, fmt, w4a4)


def test_other_formats_are_refused_in_one_line():
    with pytest.raises(CheckpointError, match=r"format 'float-quantized', weights float 8-bit") as e:
        Checkpoint.open(DATA / "llmc_llama_fp8").scheme
    assert "\n" not in str(e.value)
    for q, found in [({"quant_method": "fp8"}, "quant_method 'fp8'"),
                     ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quant_algo 'FP8'"),
                     ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
                     ({"quant_method": "compressed-tensors", "config_groups": {"g": {
                         "format": "pack-quantized", "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}},
                      "format 'pack-quantized', weights int 4-bit")]:
        with pytest.raises(CheckpointError, match=found):
            detect_quant({"quantization_config": q})
    with pytest.raises(CheckpointError, match="no quantization_config"):
        detect_quant({"model_type": "llama"})


# ----------------------------------------------------------------------------- opening, shards

def test_directory_index_and_single_shard_read_the_same_bytes():
    d = DATA / "llmc_llama"
    wm = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    # a module whose tensors lie in two shards
    files: dict[str, set] = {}
    for k, f in wm.items():
        files.setdefault(k.rsplit(".", 1)[0], set()).add(f)
    straddling = sorted(m for m, fs in files.items() if len(fs) > 1 and m + ".weight_packed" in wm)
    assert straddling
    m = straddling[0]
    a = Checkpoint.open(d).linear(m)
    b = Checkpoint.open(d / "model.safetensors.index.json").linear(m)
    assert torch.equal(a.packed, b.packed) and torch.equal(a.global_scale, b.global_scale)
    shard = d / wm[m + ".weight_packed"]
    one = Checkpoint.open(shard)
    assert one.has(m + ".weight_packed") and torch.equal(one.read(m + ".weight_packed"), a.packed)
    with pytest.raises(CheckpointError, match="no such file"):
        Checkpoint.open(d / "nope")


def test_bf16_kept_module_of_a_mixed_checkpoint_is_refused_by_name():
    for name in ("llmc_llama", "modelopt_llama"):
        ck = Checkpoint.open(DATA / name)
        assert ck.excluded("model.layers.0.self_attn.q_proj") and not ck.excluded("model.layers.1.self_attn.q_proj")
        with pytest.raises(MissingTensor, match=r"model\.layers\.0\.self_attn\.q_proj is not quantized.*kept as (BF16|F32)"):
            ck.linear("model.layers.0.self_attn.q_proj")
        assert ck.linear("model.layers.0.mlp.down_proj").k == 128


# ----------------------------------------------------------------------------- producer's dequantization

@pytest.mark.parametrize("name", LINEAR_FIXTURES)
def test_dequantization_equals_the_producers(name):
    ck, r = Checkpoint.open(DATA / name), refs(name)
    for m in modules(name):
        assert same_bf16(ck.linear(m).dequantize(torch.bfloat16), r[f"deq.{m}"]), m


def test_compressed_tensors_global_scales_are_reciprocals():
    ck = Checkpoint.open(DATA / "llmc_llama")
    m = "model.layers.1.mlp.down_proj"
    w = ck.linear(m)
    assert float(w.global_scale) == pytest.approx(1.0 / float(ck.read(m + ".weight_global_scale")), rel=1e-7)
    assert float(w.input_scale) == pytest.approx(1.0 / float(ck.read(m + ".input_global_scale")), rel=1e-7)


@pytest.mark.parametrize("name", ["modelopt_llama", "llmc_llama", "llmc_llama_mxfp4"])
def test_tp_slices_are_slices_of_the_full_dequantized_weight(name):
    ck = Checkpoint.open(DATA / name)
    for m in modules(name):
        full = ck.linear(m).dequantize(torch.float32)
        n, k = full.shape
        for tp in (2, 4):
            if n % tp == 0:
                cols = [ck.linear(m, tp_rank=r, tp_size=tp, parallel="column").dequantize(torch.float32)
                        for r in range(tp)]
                assert torch.equal(torch.cat(cols, 0), full), (m, tp)
            blk = ck.linear(m).block
            if k % (tp * blk) == 0:
                rows = [ck.linear(m, tp_rank=r, tp_size=tp, parallel="row").dequantize(torch.float32)
                        for r in range(tp)]
                assert torch.equal(torch.cat(rows, 1), full), (m, tp)
            else:
                with pytest.raises(CheckpointError, match="whole .*-element blocks"):
                    ck.linear(m, tp_rank=0, tp_size=tp, parallel="row")


def test_a_rank_reads_only_its_bytes_and_bad_splits_are_refused():
    ck = Checkpoint.open(DATA / "modelopt_llama")
    m = "model.layers.1.mlp.down_proj"            # K = 128: 8 blocks of 16
    ck.linear(m, tp_rank=1, tp_size=2, parallel="row")
    reads = dict(ck.reads)
    assert reads[m + ".weight"] == (slice(None), slice(32, 64))       # packed K/2 columns of rank 1
    assert reads[m + ".weight_scale"] == (slice(None), slice(4, 8))
    with pytest.raises(CheckpointError, match=r"128 does not split into 16 equal shards of whole 16-element blocks"):
        ck.linear(m, tp_rank=0, tp_size=16, parallel="row")
    with pytest.raises(CheckpointError, match="tp_rank 2 is not in"):
        ck.linear(m, tp_rank=2, tp_size=2, parallel="column")
    with pytest.raises(CheckpointError, match="needs parallel="):
        ck.linear(m, tp_rank=0, tp_size=2)


# ----------------------------------------------------------------------------- layers

def test_linear_w4a4_matches_the_producers_w4a4_layer_and_w4a16_float64(disp):
    for name, tol4 in (("modelopt_llama", 5e-3), ("llmc_llama", 3e-2)):
        r = refs(name)
        for m in modules(name):
            x = r[f"x.{m}"]
            f4 = FP4Linear.from_pretrained(DATA / name, m, activations="w4a4", dispatcher=disp)
            f16 = FP4Linear.from_pretrained(DATA / name, m, activations="w4a16", dispatcher=disp)
            assert f4.problem.a_fmt == "nvfp4" and f16.problem.a_fmt == "bf16"
            e4, e16 = rel(f4(x), r[f"y4.{m}"]), rel(f16(x), r[f"y4.{m}"])
            assert e4 < tol4 and e4 < e16 / 3, (name, m, e4, e16)      # W4A16 is ~9 % off the W4A4 layer
            assert rel(f16(x), x.double() @ r[f"deq.{m}"].double().T) < 1e-2


@pytest.mark.parametrize("name", ["llmc_llama_a16", "llmc_llama_mxfp4"])
def test_weight_only_checkpoints_match_the_producers_layer(name, disp):
    r = refs(name)
    for m in modules(name):
        f = FP4Linear.from_pretrained(DATA / name, m, dispatcher=disp)
        assert f.problem.a_fmt == "bf16"
        assert rel(f(r[f"x.{m}"]), r[f"y.{m}"]) < 1e-2
    with pytest.raises(ValueError, match="no static activation scales"):
        FP4Linear.from_pretrained(DATA / name, modules(name)[0], activations="w4a4", dispatcher=disp)


def test_linear_tp_ranks_add_up_to_the_whole_layer(disp):
    name, r = "modelopt_llama", refs("modelopt_llama")
    for m, par in (("model.layers.1.mlp.down_proj", "row"), ("model.layers.1.mlp.gate_proj", "column")):
        x = r[f"x.{m}"]
        ref = x.double() @ r[f"deq.{m}"].double().T
        half = x.shape[1] // 2                    # a row-parallel rank sees its K slice of x
        xs = [x[:, k * half:(k + 1) * half] if par == "row" else x for k in range(2)]
        ys = [FP4Linear.from_pretrained(DATA / name, m, tp_rank=k, tp_size=2, activations="w4a16",
                                        dispatcher=disp)(xs[k]).double() for k in range(2)]
        y = sum(ys) if par == "row" else torch.cat(ys, 1)
        assert rel(y, ref) < 1e-2, m


def _moe_inputs(r, blk):
    return r[f"x.{blk}"], r[f"ids.{blk}"].to(torch.int32), r[f"tw.{blk}"]


def test_qwen3_moe_whole_ep_and_tp_match_the_producer(disp):
    r, blk = refs("modelopt_qwen3moe"), "model.layers.0.mlp"
    x, ids, tw = _moe_inputs(r, blk)
    whole = FP4MoE.from_pretrained(DATA / "modelopt_qwen3moe", blk, activations="w4a16", dispatcher=disp)
    assert whole.top_k == 2 and whole.num_experts == 4 and whole.expert_map is None
    y = whole(x, ids, tw)
    assert rel(y, r[f"y.{blk}"]) < 1e-2                        # HF's experts module, float64
    ep = [FP4MoE.from_pretrained(DATA / "modelopt_qwen3moe", blk, ep_rank=k, ep_size=2, activations="w4a16",
                                 dispatcher=disp) for k in range(2)]
    assert ep[1].expert_map.tolist() == [-1, -1, 0, 1]
    assert rel(sum(b(x, ids, tw).double() for b in ep), r[f"y.{blk}"]) < 1e-2
    tp = [FP4MoE.from_pretrained(DATA / "modelopt_qwen3moe", blk, tp_rank=k, tp_size=2, activations="w4a16",
                                 dispatcher=disp) for k in range(2)]
    assert tp[0].intermediate == 16
    assert rel(sum(b(x, ids, tw).double() for b in tp), r[f"y.{blk}"]) < 1e-2
    w4 = FP4MoE.from_pretrained(DATA / "modelopt_qwen3moe", blk, activations="w4a4", dispatcher=disp)
    assert w4.problem13.a_fmt == "nvfp4" and w4.w13.input_scale.shape == (4,)
    # the intermediate is requantized to FP4: vLLM rounds gate/up to bf16 before SiLU·up, the fused
    # epilogue does not, and a one-ulp difference in h flips an FP4 code: a few % apart, W4A16 ~20 %
    e4, e16 = rel(w4(x, ids, tw), r[f"y4.{blk}"]), rel(y, r[f"y4.{blk}"])
    assert e4 < 6e-2 and e4 < e16 / 3, (e4, e16)


def test_expert_slices_are_slices_of_the_full_experts():
    ck = Checkpoint.open(DATA / "modelopt_qwen3moe")
    full = read_experts(ck, "model.layers.1.mlp")
    part = read_experts(ck, "model.layers.1.mlp", [3, 1], tp_rank=1, tp_size=2)
    f13, p13 = full.w13.dequantize(), part.w13.dequantize()
    i = full.w2.k
    for local, e in enumerate((3, 1)):
        assert torch.equal(p13[local], torch.cat([f13[e, i // 2:i], f13[e, i + i // 2:]]))
        assert torch.equal(part.w2.dequantize()[local], full.w2.dequantize()[e][:, i // 2:])
    with pytest.raises(CheckpointError, match="distinct ids"):
        read_experts(ck, "model.layers.1.mlp", [4])
    with pytest.raises(CheckpointError, match=r"32 does not split into 4 equal shards of whole 16-element blocks"):
        read_experts(ck, "model.layers.1.mlp", tp_rank=0, tp_size=4)      # I = 32: 8 per rank cuts a block
    with pytest.raises(CheckpointError, match="4 experts do not split into 3"):
        FP4MoE.from_pretrained(DATA / "modelopt_qwen3moe", "model.layers.1.mlp", ep_rank=0, ep_size=3)


def test_loaders_refuse_a_non_fp4_checkpoint_in_one_line(disp):
    with pytest.raises(CheckpointError, match="float-quantized") as e:
        FP4Linear.from_pretrained(DATA / "llmc_llama_fp8", "model.layers.0.mlp.down_proj", dispatcher=disp)
    assert "\n" not in str(e.value)


def test_deepseek_routed_plus_shared_experts(disp):
    r, blk = refs("modelopt_deepseek"), "model.layers.1.mlp"
    x, ids, tw = _moe_inputs(r, blk)
    b = FP4MoE.from_pretrained(DATA / "modelopt_deepseek", blk, activations="w4a16", dispatcher=disp,
                               fold_shared=False)
    assert b.has_shared and not b.shared_folded and b.num_experts == 4      # apart: an FP4MLP
    assert rel(b(x, ids, tw), r[f"y.{blk}"]) < 1e-2
    folded = FP4MoE.from_pretrained(DATA / "modelopt_deepseek", blk, activations="w4a16", dispatcher=disp)
    assert folded.shared_folded and folded.num_experts == 5
    assert rel(folded(x, ids, tw), r[f"y.{blk}"]) < 1e-2
    routed = FP4MoE.from_pretrained(DATA / "modelopt_deepseek", blk, shared_experts=False, activations="w4a16",
                                    dispatcher=disp)
    assert rel(routed(x, ids, tw).double() + r[f"y.{blk}.shared_experts"], r[f"y.{blk}"]) < 1e-2
    w4 = FP4MoE.from_pretrained(DATA / "modelopt_deepseek", blk, activations="w4a4", dispatcher=disp)
    assert w4.shared_folded and w4.problem13.a_fmt == "nvfp4" and w4.w13_is.shape == (5,) and w4.w2_is.shape == (5,)  # shared: 5th
    assert rel(w4(x, ids, tw), r[f"y.{blk}"]) < 0.3         # W4A4 on inputs calibrated for it


@pytest.mark.parametrize("name", ["gptoss_mxfp4", "modelopt_gptoss"])
def test_gpt_oss_experts_as_vllm_computes_them(name, disp):
    """Interleaved gate/up rows, biases, clamped SwiGLU (alpha 1.702, limit 7): HF's GptOssExperts in
    float64 on the producer's dequantized weights; TP=2 ranks (vLLM's whole-MX-block split) add up."""
    r, blk = refs(name), "model.layers.0.mlp"
    x, ids, tw = _moe_inputs(r, blk)
    ck = Checkpoint.open(DATA / name)
    ew = read_experts(ck, blk)
    assert ew.interleaved and torch.equal(ew.w13.dequantize(torch.bfloat16), r[f"deq.{blk}.experts.gate_up_proj"])
    assert torch.equal(ew.w2.dequantize(torch.bfloat16), r[f"deq.{blk}.experts.down_proj"])
    b = FP4MoE.from_pretrained(DATA / name, blk, activations="w4a16", dispatcher=disp)
    assert b.activation == "swigluoai" and not b.fused and b.bias13 is not None
    y = b(x, ids, tw)
    assert rel(y, r[f"y.{blk}"]) < 1e-2
    pre = (x.double() @ ew.w13.dequantize(torch.float64)[0].T)            # the clamp is reached
    assert float(pre.abs().max()) > 7
    tp = [FP4MoE.from_pretrained(DATA / name, blk, tp_rank=k, tp_size=2, activations="w4a16", dispatcher=disp)
          for k in range(2)]
    assert rel(sum(t(x, ids, tw).double() for t in tp), r[f"y.{blk}"]) < 1e-2
    if ck.scheme.w4a4:                            # ModelOpt's stacked export is W4A4: the emulated path runs
        w4 = FP4MoE.from_pretrained(DATA / name, blk, activations="w4a4", dispatcher=disp)
        assert w4.problem2.a_fmt == "nvfp4" and bool(torch.isfinite(w4(x, ids, tw)).all())


def test_from_modelopt_is_the_reader_on_a_real_export(disp):
    ck_dir = DATA / "modelopt_qwen3moe"
    blk = FP4MoE.from_modelopt(str(ck_dir), "model.layers.1.mlp", range(4), 2, dispatcher=disp)
    r = refs("modelopt_qwen3moe")
    x, ids, tw = _moe_inputs(r, "model.layers.1.mlp")
    assert rel(blk(x, ids, tw), r["y.model.layers.1.mlp"]) < 1e-2
    lin = FP4Linear.from_modelopt(str(DATA / "modelopt_llama"), "model.layers.1.mlp.up_proj", dispatcher=disp)
    assert same_bf16(lin.weight.dequantize(torch.bfloat16), refs("modelopt_llama")["deq.model.layers.1.mlp.up_proj"])


# ----------------------------------------------------------------------------- the W4A4 choice

def test_w4a4_tactic_exists_only_on_native_fp4_archs_for_dense():
    w4 = Problem.dense(4096, 4096, a_fmt="nvfp4")
    assert act.w4a4_tactic_exists(w4, get_arch("sm120")) and act.w4a4_tactic_exists(w4, get_arch("sm100"))
    assert not act.w4a4_tactic_exists(w4, get_arch("sm90")) and not act.w4a4_tactic_exists(w4, ARCHS["cpu"])
    assert not act.w4a4_tactic_exists(Problem.moe(512, 4096, 8, 2, a_fmt="nvfp4"), get_arch("sm120"))


def test_auto_runs_w4a16_with_one_warning_and_the_flag_or_env_chooses(disp, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_ACTIVATIONS", raising=False)
    act._WARNED.clear()
    m = "model.layers.1.mlp.down_proj"
    with pytest.warns(UserWarning, match="cpu has no W4A4 dense tactic: running W4A16"):
        f = FP4Linear.from_pretrained(DATA / "llmc_llama", m, dispatcher=disp)
    assert f.problem.a_fmt == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # once per (arch, kind): the second layer is quiet
        FP4Linear.from_pretrained(DATA / "llmc_llama", "model.layers.1.mlp.up_proj", dispatcher=disp)
    assert FP4Linear.from_pretrained(DATA / "llmc_llama", m, arch="sm120", dispatcher=disp).problem.a_fmt == "nvfp4"
    monkeypatch.setenv("AUTOTUNE_ACTIVATIONS", "w4a4")
    assert FP4Linear.from_pretrained(DATA / "llmc_llama", m, dispatcher=disp).problem.a_fmt == "nvfp4"
    monkeypatch.setenv("AUTOTUNE_ACTIVATIONS", "w4a8")
    with pytest.raises(ValueError, match=r"\$AUTOTUNE_ACTIVATIONS must be one of auto, w4a4, w4a16"):
        FP4Linear.from_pretrained(DATA / "llmc_llama", m, dispatcher=disp)


def test_search_reads_the_same_setting_as_the_loaders():
    from autotune.api import model_problems
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keys = lambda **kw: {u.problem.key for u in model_problems(DATA / "modelopt_qwen3moe", **kw)}  # noqa: E731
        sm120, sm90 = keys(arch="sm120"), keys(arch="sm90")
        forced = keys(arch="cpu", activations="w4a4")
    assert "dense:nvfp4*nvfp4->bf16:n64:k64" in sm120               # o_proj: a W4A4 kernel exists there
    assert "grouped_moe:bf16*nvfp4->bf16:n64:k32:e4:top2" in sm120    # no W4A4 MoE kernel: W4A16
    assert all(k.split(":")[1].startswith("bf16") for k in sm90)
    assert "grouped_moe:nvfp4*nvfp4->bf16:n64:k32:e4:top2" in forced


def test_qwen3_moe_transformers5_spells_num_local_experts():
    from autotune.models import load_model
    cfg = json.loads((DATA / "modelopt_qwen3moe" / "config.json").read_text())
    assert "num_local_experts" in cfg and "num_experts" not in cfg    # what transformers 5.x writes
    arch, rule = load_model(DATA / "modelopt_qwen3moe")
    assert arch.experts == 4 and arch.moe_layers == (0, 1) and rule.w4a4


@pytest.mark.parametrize("name", ["modelopt_llama", "modelopt_qwen3moe", "modelopt_deepseek", "modelopt_gptoss",
                                  "llmc_llama", "llmc_llama_a16", "llmc_llama_mxfp4", "gptoss_mxfp4"])
def test_cli_search_dry_run_on_the_fixture_dirs(name):
    from click.testing import CliRunner
    from autotune.cli import main
    res = CliRunner().invoke(main, ["search", "--model", str(DATA / name), "--dry-run", "--arch", "sm120",
                                    "--families", "torch"])
    assert res.exit_code == 0, res.output
    assert "grouped_moe" in res.output or "dense" in res.output
