"""Make the tiny FP4 checkpoints under tests/data/ckpt/ with the REAL producers (run once, commit).

Run in a separate virtualenv that holds the producers (they pull their own torch; CI never
installs them):

    python3 -m venv /tmp/prodenv
    /tmp/prodenv/bin/pip install /opt/wheels/torch-2.13.0+cpu-*.whl      # or any CPU torch
    /tmp/prodenv/bin/pip install nvidia-modelopt==0.47.0 llmcompressor==0.14.0.1 transformers safetensors
    /tmp/prodenv/bin/python tools/make_checkpoint_fixtures.py tests/data/ckpt   # versions -> MANIFEST.json

Each fixture is a checkpoint directory saved SHARDED with tiny shards (so some modules' tensors
straddle two files) plus `<name>.ref.safetensors` beside it with what the producer itself
computes, so CI compares against the producer without installing it:

* `deq.<module>`: the producer's own dequantization of that module's weight (bf16, checkpoint
  orientation [.., N, K]) — ModelOpt `NVFP4QTensor.dequantize`, compressed-tensors
  `NVFP4PackedCompressor.decompress`, transformers' `convert_moe_packed_tensors` for gpt-oss MXFP4;
* `x.<module>`: a fixed input (bf16 values, in the calibrated range), and
  `y4.<module>` the producer's W4A4 output — compressed-tensors: its own fake-quant module's
  forward; ModelOpt: its fake-quant layer cannot run on a CPU (`_dynamic_block_quantize_impl`
  asserts a CUDA amax), so x is quantized by ModelOpt's `NVFP4QTensor.quantize` under the
  exported input_scale and multiplied with ModelOpt's dequantized weight in float64 — or, for a
  weight-only scheme, `y.<module>` the producer's module output (float64);
* MoE blocks: `x.`, `ids.`, `tw.` (fixed routing), `y.` the HF experts module's own forward in
  float64 on the producer's dequantized weights (W4A16), `y4.` (ModelOpt) vLLM's W4A4 MoE in
  float64 from ModelOpt-quantized operands (w13 input scale max(gate, up), w2 down's).

Fixtures (MANIFEST.json says which producer made each): modelopt_llama (NVFP4 W4A4, layer 0
self_attn kept bf16: mixed), modelopt_qwen3moe (transformers 5 fused experts exported per expert;
config spells num_local_experts), modelopt_deepseek (routed + shared experts), modelopt_gptoss
(ModelOpt's STACKED bmm experts with biases), llmc_llama (NVFP4 W4A4, mixed), llmc_llama_a16
(NVFP4A16), llmc_llama_mxfp4 (MXFP4A16), llmc_llama_fp8 (FP8: to be refused), gptoss_mxfp4:
OpenAI's MXFP4 layout (`*_blocks`/`*_scales`) — no producer writing it runs here, so it is a
DOCUMENTED-LAYOUT fixture: bytes from ModelOpt's MXFP4QTensor.quantize, reference from
transformers' convert_moe_packed_tensors and GptOssExperts.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import torch

SHARD, SEED, VOCAB = "10KB", 0, 32


def _save_refs(path: Path, refs: dict) -> None:
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous().cpu() for k, v in refs.items()}, str(path))


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")),
                                   unk_token="t0", pad_token="t0")


def _llama_cfg(layers=2):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=64,
                       architectures=["LlamaForCausalLM"])


def _calib_ids(n=4, t=16):
    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, VOCAB, (n, t), generator=g)


def _x(k: int, m: int = 5, seed: int = 7, input_scale=None) -> torch.Tensor:
    """A fixed input; with a static input_scale, scaled into the calibrated range (amax 0.9 x
    6 * 448 * input_scale) as calibration data would be: beyond it W4A4 saturates."""
    g = torch.Generator().manual_seed(seed + k)
    x = torch.randn(m, k, generator=g)
    if input_scale is not None:
        x = x / x.abs().max() * (0.9 * 6 * 448 * float(input_scale))
    return x.to(torch.bfloat16).float()      # engines' activations are bf16: the same input both sides


def _shard_files(d: Path) -> dict:
    idx = d / "model.safetensors.index.json"
    return json.loads(idx.read_text())["weight_map"] if idx.exists() else {}


def _read(d: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open
    wm = _shard_files(d)
    with safe_open(str(d / wm[name]), "pt") as f:
        return f.get_tensor(name)


def _clean(d: Path) -> None:
    for extra in ("generation_config.json", "recipe.yaml", "tokenizer.json", "tokenizer_config.json"):
        (d / extra).unlink(missing_ok=True)


# --------------------------------------------------------------------------- ModelOpt

def _mo_deq(d: Path, mod: str, stacked: bool = False) -> torch.Tensor:
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    sep = "_" if stacked else "."
    w = _read(d, mod + ("" if stacked else ".weight"))
    ws = _read(d, f"{mod}{sep}weight_scale")
    ws2 = _read(d, f"{mod}{sep}weight_scale_2")
    if stacked:     # [E, K/2, N] / [E, K/16, N]: ModelOpt quantized the transposed per-expert [N, K]
        outs = []
        for e in range(w.shape[0]):
            we, se = w[e].T.contiguous(), ws[e].T.contiguous()
            q = NVFP4QTensor(torch.Size((we.shape[0], we.shape[1] * 2)), torch.bfloat16, we)
            g = ws2.reshape(-1)[e] if ws2.numel() > 1 else ws2.reshape(())
            outs.append(q.dequantize(dtype=torch.bfloat16, scale=se, double_scale=g, block_sizes={-1: 16}))
        return torch.stack(outs)                      # [E, N, K]
    shape = (*w.shape[:-1], w.shape[-1] * 2)
    q = NVFP4QTensor(torch.Size(shape), torch.bfloat16, w)
    return q.dequantize(dtype=torch.bfloat16, scale=ws, double_scale=ws2, block_sizes={-1: 16})


def _mo_act(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """x as ModelOpt's NVFP4 quantizer makes it under the static input_scale (NVFP4QTensor quantize,
    then dequantize), float64. ModelOpt's fake-quant layer cannot run here: its FP4 path asserts
    a CUDA amax (tensor_quant._dynamic_block_quantize_impl) and needs Triton or its CUDA extension."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    isc = input_scale.float().reshape(())
    q, s, _ = NVFP4QTensor.quantize(x.float(), 16, weights_scaling_factor_2=isc)
    return q.dequantize(dtype=torch.float32, scale=s, double_scale=isc, block_sizes={-1: 16}).double()


REF_LINEARS = ("model.layers.1.",)      # references are kept for these modules only (small fixtures)


def _mo_linear_refs(model, d: Path, refs: dict) -> None:
    """deq + W4A4 output (y4, ModelOpt's activation quantizer, float64) of the quantized nn.Linears of
    REF_LINEARS."""
    wm = _shard_files(d)
    for name, mod in model.named_modules():
        if f"{name}.weight_scale" not in wm or not isinstance(mod, torch.nn.Linear) or not name.startswith(REF_LINEARS):
            continue
        deq = refs[f"deq.{name}"] = _mo_deq(d, name)
        x = _x(mod.in_features, input_scale=_read(d, f"{name}.input_scale"))
        refs[f"x.{name}"] = x
        refs[f"y4.{name}"] = _mo_act(x, _read(d, f"{name}.input_scale")) @ deq.double().T


def modelopt_llama(out: Path) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import LlamaForCausalLM
    torch.manual_seed(SEED)
    m = LlamaForCausalLM(_llama_cfg()).to(torch.bfloat16).eval()   # bf16 source weights, as real ones
    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    cfg["quant_cfg"].append({"quantizer_name": "*layers.0.self_attn*", "enable": False})   # mixed checkpoint
    ids = _calib_ids()
    m = mtq.quantize(m, cfg, lambda mm: mm(ids))
    d = out / "modelopt_llama"
    export_hf_checkpoint(m, dtype=torch.bfloat16, export_dir=d, max_shard_size=SHARD)
    refs: dict = {}
    _mo_linear_refs(m, d, refs)
    _save_refs(out / "modelopt_llama.ref.safetensors", refs)
    _clean(d)


def _fixed_routing(m: int, e: int, k: int, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)])
    w = torch.rand(m, k, generator=g) + 0.1
    return ids, (w / w.sum(1, keepdim=True)).float()


def _experts_call(experts, x, ids, w):
    """The HF experts module's own forward, float64 (eager implementation)."""
    experts.config._experts_implementation = "eager"
    with torch.no_grad():
        return experts(x.double(), ids, w.double())


def _hf_experts64(model, layer: int, deq: dict, blk: str, n: int):
    """A float64 copy of the layer's HF experts module holding the producer's dequantized weights
    (transformers 5 fused experts: gate_up_proj [E, 2I, H] = [gate; up] rows, down_proj [E, H, I])."""
    ex = copy.deepcopy(_orig_experts[id(model)][layer]).double()
    with torch.no_grad():
        g = torch.stack([deq[f"deq.{blk}.experts.{e}.gate_proj"] for e in range(n)]).double()
        u = torch.stack([deq[f"deq.{blk}.experts.{e}.up_proj"] for e in range(n)]).double()
        dn = torch.stack([deq[f"deq.{blk}.experts.{e}.down_proj"] for e in range(n)]).double()
        ex.gate_up_proj.copy_(torch.cat([g, u], 1))
        ex.down_proj.copy_(dn)
    return ex


_orig_experts: dict = {}


def _keep_experts(model, layers) -> None:
    _orig_experts[id(model)] = {i: copy.deepcopy(model.model.layers[i].mlp.experts) for i in layers}


def _mo_moe_w4a4(d: Path, refs: dict, blk: str, n: int, x, ids, tw) -> torch.Tensor:
    """vLLM's W4A4 NVFP4 MoE in float64 from ModelOpt-quantized operands: per expert, x quantized under
    max(gate, up) input_scale, h = silu(gate)·up (bf16, as the engines' intermediate) quantized under
    down's, routing weights, top_k sum."""
    y = torch.zeros(x.shape[0], refs[f"deq.{blk}.experts.0.down_proj"].shape[0], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            p = f"{blk}.experts.{e}."
            i13 = torch.maximum(_read(d, p + "gate_proj.input_scale"), _read(d, p + "up_proj.input_scale"))
            xq = _mo_act(x[t:t + 1], i13)
            bf = lambda v: v.to(torch.bfloat16).double()   # noqa: E731 - the engines' bf16 GEMM outputs
            h = bf(torch.nn.functional.silu(bf(xq @ refs[f"deq.{p}gate_proj"].double().T))
                   * bf(xq @ refs[f"deq.{p}up_proj"].double().T))
            y[t] += tw[t, j].double() * (_mo_act(h, _read(d, p + "down_proj.input_scale")) @ refs[f"deq.{p}down_proj"].double().T)[0]
    return y


def modelopt_qwen3moe(out: Path) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(SEED)
    cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=64, architectures=["Qwen3MoeForCausalLM"])
    m = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    _keep_experts(m, range(cfg.num_hidden_layers))
    ids = _calib_ids()
    m = mtq.quantize(m, mtq.NVFP4_DEFAULT_CFG, lambda mm: mm(ids))
    d = out / "modelopt_qwen3moe"
    export_hf_checkpoint(m, dtype=torch.bfloat16, export_dir=d, max_shard_size=SHARD)
    refs: dict = {}
    wm = _shard_files(d)
    for i, layer in enumerate(m.model.layers):
        blk = f"model.layers.{i}.mlp"
        for e in range(cfg.num_experts):
            for p in ("gate_proj", "up_proj", "down_proj"):
                refs[f"deq.{blk}.experts.{e}.{p}"] = _mo_deq(d, f"{blk}.experts.{e}.{p}")
        x = _x(cfg.hidden_size, m=6, seed=20 + i, input_scale=_read(d, f"{blk}.experts.0.gate_proj.input_scale"))
        rid, rw = _fixed_routing(6, cfg.num_experts, cfg.num_experts_per_tok)
        refs[f"x.{blk}"], refs[f"ids.{blk}"], refs[f"tw.{blk}"] = x, rid, rw
        refs[f"y.{blk}"] = _experts_call(_hf_experts64(m, i, refs, blk, cfg.num_experts), x, rid, rw)
        refs[f"y4.{blk}"] = _mo_moe_w4a4(d, refs, blk, cfg.num_experts, x, rid, rw)
    assert any(".experts.0.gate_proj.weight" in k for k in wm)
    _save_refs(out / "modelopt_qwen3moe.ref.safetensors", refs)
    _clean(d)


def modelopt_deepseek(out: Path) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(SEED)
    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                           num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                           q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                           v_head_dim=16, vocab_size=VOCAB, max_position_embeddings=64,
                           architectures=["DeepseekV3ForCausalLM"])
    m = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
    _keep_experts(m, [1])
    shared0 = copy.deepcopy(m.model.layers[1].mlp.shared_experts).double()
    ids = _calib_ids()
    qc = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    qc["quant_cfg"].append({"quantizer_name": "*self_attn*", "enable": False})   # NVIDIA's rule keeps MLA bf16
    m = mtq.quantize(m, qc, lambda mm: mm(ids))
    d = out / "modelopt_deepseek"
    export_hf_checkpoint(m, dtype=torch.bfloat16, export_dir=d, max_shard_size=SHARD)
    refs: dict = {}
    wm = _shard_files(d)
    blk = "model.layers.1.mlp"
    for p in ("gate_proj", "up_proj", "down_proj"):
        refs[f"deq.{blk}.shared_experts.{p}"] = _mo_deq(d, f"{blk}.shared_experts.{p}")
    for e in range(cfg.n_routed_experts):
        for p in ("gate_proj", "up_proj", "down_proj"):
            refs[f"deq.{blk}.experts.{e}.{p}"] = _mo_deq(d, f"{blk}.experts.{e}.{p}")
    layer = m.model.layers[1].mlp
    x = _x(cfg.hidden_size, m=6, seed=30, input_scale=_read(d, f"{blk}.experts.0.gate_proj.input_scale"))
    rid, rw = _fixed_routing(6, cfg.n_routed_experts, cfg.num_experts_per_tok)
    refs[f"x.{blk}"], refs[f"ids.{blk}"], refs[f"tw.{blk}"] = x, rid, rw
    routed = _experts_call(_hf_experts64(m, 1, refs, blk, cfg.n_routed_experts), x, rid, rw)
    with torch.no_grad():                 # the HF shared-expert MLP, float64, on ModelOpt's dequantized weights
        for p in ("gate_proj", "up_proj", "down_proj"):
            getattr(shared0, p).weight.copy_(refs[f"deq.{blk}.shared_experts.{p}"].double())
        shared = shared0(x.double())
    refs[f"y.{blk}"] = routed + shared        # routed + shared, as the block adds them (W4A16, float64)
    refs[f"y.{blk}.shared_experts"] = shared
    assert f"{blk}.shared_experts.down_proj.weight" in wm
    _save_refs(out / "modelopt_deepseek.ref.safetensors", refs)
    _clean(d)


def _gptoss_cfg():
    from transformers import GptOssConfig
    return GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                        vocab_size=VOCAB, max_position_embeddings=64, sliding_window=16,
                        layer_types=["full_attention"], architectures=["GptOssForCausalLM"])


def _gptoss_model():
    from transformers import GptOssForCausalLM
    torch.manual_seed(SEED)
    m = GptOssForCausalLM(_gptoss_cfg()).to(torch.bfloat16).eval()
    with torch.no_grad():     # random init leaves biases at zero: give them values so they are tested
        for p in (m.model.layers[0].mlp.experts.gate_up_proj_bias, m.model.layers[0].mlp.experts.down_proj_bias):
            p.copy_(torch.randn_like(p) * 0.05)
        m.model.layers[0].mlp.experts.gate_up_proj.mul_(40.0)   # reach the SwiGLU clamp (limit 7) on some rows
    return m


def modelopt_gptoss(out: Path) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    m = _gptoss_model()
    cfg = m.config
    orig = copy.deepcopy(m.model.layers[0].mlp.experts)
    ids = _calib_ids()
    qc = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    qc["quant_cfg"].append({"quantizer_name": "*self_attn*", "enable": False})
    m = mtq.quantize(m, qc, lambda mm: mm(ids))
    d = out / "modelopt_gptoss"
    export_hf_checkpoint(m, dtype=torch.bfloat16, export_dir=d, max_shard_size=SHARD)
    refs: dict = {}
    blk = "model.layers.0.mlp"
    for p in ("gate_up_proj", "down_proj"):
        deq = refs[f"deq.{blk}.experts.{p}"] = _mo_deq(d, f"{blk}.experts.{p}", stacked=True)
        w0 = getattr(orig, p).detach().transpose(1, 2).float()
        rel = float((deq.float() - w0).norm() / w0.norm())
        assert rel < 0.2, f"{p}: the [E, K/2, N] reading of ModelOpt's stacked export is off by {rel:.3f}"
    ex = copy.deepcopy(orig).double()
    with torch.no_grad():
        for p in ("gate_up_proj", "down_proj"):
            getattr(ex, p).copy_(refs[f"deq.{blk}.experts.{p}"].double().transpose(1, 2))
            getattr(ex, f"{p}_bias").copy_(_read(d, f"{blk}.experts.{p}_bias").double())
    x = _x(cfg.hidden_size, m=6, seed=40) * 3.0
    rid, rw = _fixed_routing(6, cfg.num_local_experts, cfg.num_experts_per_tok)
    refs[f"x.{blk}"], refs[f"ids.{blk}"], refs[f"tw.{blk}"] = x, rid, rw
    refs[f"y.{blk}"] = _experts_call(ex, x, rid, rw)    # HF GptOssExperts (clamped SwiGLU), float64, W4A16
    _save_refs(out / "modelopt_gptoss.ref.safetensors", refs)
    _clean(d)


# --------------------------------------------------------------------------- llm-compressor

def _llmc(out: Path, name: str, scheme: str, ignore: list, layers: int = 2) -> None:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    torch.manual_seed(SEED)
    base = out / f"_base_{name}"
    LlamaForCausalLM(_llama_cfg(layers)).to(torch.bfloat16).save_pretrained(base)
    tk = _tokenizer()
    tk.save_pretrained(base)
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    ids = _calib_ids()
    ds = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    rec = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    oneshot(model=m, dataset=ds, recipe=rec, processor=tk, num_calibration_samples=4, max_seq_length=16)
    refs: dict = {}
    outs = {}
    for mname, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear) and getattr(mod, "quantization_scheme", None) is not None \
                and mname.startswith(REF_LINEARS if layers > 1 else ("model.layers.0.",)):
            igs = getattr(mod, "input_global_scale", None)
            x = _x(mod.in_features, input_scale=None if igs is None else 1.0 / float(igs.reshape(-1)[0]))
            with torch.no_grad():
                outs[mname] = (x, mod(x.to(mod.weight.dtype)).double())   # compressed-tensors' own forward
    d = out / name
    m.save_pretrained(d, save_compressed=True, max_shard_size=SHARD)
    shutil.rmtree(base)
    if scheme != "FP8":          # the FP8 checkpoint exists to be refused: no reference
        _ct_refs(d, outs, refs)
        _save_refs(out / f"{name}.ref.safetensors", refs)
    _clean(d)


def _ct_refs(d: Path, outs: dict, refs: dict) -> None:
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"],
                                input_activations=group.get("input_activations"))
    comp = MXFP4PackedCompressor if qc["format"] == "mxfp4-pack-quantized" else NVFP4PackedCompressor
    wm = _shard_files(d)
    for mname, (x, y) in outs.items():
        sd = {k[len(mname) + 1:]: _read(d, k) for k in wm if k.startswith(mname + ".")}
        w = comp.decompress(sd, scheme)["weight"]
        refs[f"deq.{mname}"] = w.to(torch.bfloat16)
        refs[f"x.{mname}"] = x
        refs[f"{'y4' if group.get('input_activations') else 'y'}.{mname}"] = y


def llmc_llama(out: Path) -> None:
    _llmc(out, "llmc_llama", "NVFP4", ["lm_head", "re:.*layers\\.0\\.self_attn\\..*"])


def llmc_llama_a16(out: Path) -> None:
    _llmc(out, "llmc_llama_a16", "NVFP4A16", ["lm_head"], layers=1)


def llmc_llama_mxfp4(out: Path) -> None:
    _llmc(out, "llmc_llama_mxfp4", "MXFP4A16", ["lm_head"], layers=1)


def llmc_llama_fp8(out: Path) -> None:
    _llmc(out, "llmc_llama_fp8", "FP8", ["lm_head"], layers=1)


# --------------------------------------------------------------------------- gpt-oss MXFP4 (documented layout)

def gptoss_mxfp4(out: Path) -> None:
    from modelopt.torch.quantization.qtensor.mxfp4_tensor import MXFP4QTensor
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    m = _gptoss_model()
    cfg = m.config
    ex = m.model.layers[0].mlp.experts
    d = out / "gptoss_mxfp4"
    d.mkdir(parents=True, exist_ok=True)
    sd = {}
    # HF parameters are [E, H, 2I] / [E, I, H] (x @ W); the checkpoint stores [E, rows=out, K/32, 16]
    for p in ("gate_up_proj", "down_proj"):
        w = getattr(ex, p).detach().transpose(1, 2).contiguous().to(torch.bfloat16)     # [E, N, K]
        e, n, k = w.shape
        q, s = MXFP4QTensor.quantize(w, 32)
        sd[f"model.layers.0.mlp.experts.{p}_blocks"] = q._quantized_data.reshape(e, n, k // 32, 16)
        sd[f"model.layers.0.mlp.experts.{p}_scales"] = s.reshape(e, n, k // 32)
        sd[f"model.layers.0.mlp.experts.{p}_bias"] = getattr(ex, f"{p}_bias").detach().to(torch.bfloat16)
    sd["model.layers.0.mlp.router.weight"] = m.model.layers[0].mlp.router.weight.detach().to(torch.bfloat16)
    sd["model.layers.0.mlp.router.bias"] = m.model.layers[0].mlp.router.bias.detach().to(torch.bfloat16)
    # two shards; the index names each tensor's file (the bias of gate_up sits apart from its blocks)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    wm = {}
    for f, ks in shards.items():
        save_file({k: sd[k].contiguous() for k in ks}, str(d / f), metadata={"format": "pt"})
        wm.update({k: f for k in ks})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=2))
    c = cfg.to_dict()
    c["quantization_config"] = {"quant_method": "mxfp4",
                                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"]}
    (d / "config.json").write_text(json.dumps(c, indent=2, default=str))
    refs: dict = {}
    blk = "model.layers.0.mlp"
    with torch.no_grad():
        for p in ("gate_up_proj", "down_proj"):
            deq = convert_moe_packed_tensors(sd[f"{blk}.experts.{p}_blocks"], sd[f"{blk}.experts.{p}_scales"],
                                             dtype=torch.bfloat16)                         # [E, K, N] (HF)
            refs[f"deq.{blk}.experts.{p}"] = deq.transpose(1, 2).contiguous()            # [E, N, K]
            getattr(ex, p).copy_(deq.float())
            getattr(ex, f"{p}_bias").copy_(sd[f"{blk}.experts.{p}_bias"].float())
        x = _x(cfg.hidden_size, m=6, seed=40) * 3.0
        rid, rw = _fixed_routing(6, cfg.num_local_experts, cfg.num_experts_per_tok)
        refs[f"x.{blk}"], refs[f"ids.{blk}"], refs[f"tw.{blk}"] = x, rid, rw
    refs[f"y.{blk}"] = _experts_call(ex.double(), x, rid, rw)        # HF GptOssExperts in float64
    _save_refs(out / "gptoss_mxfp4.ref.safetensors", refs)


FIXTURES = [modelopt_llama, modelopt_qwen3moe, modelopt_deepseek, modelopt_gptoss, llmc_llama, llmc_llama_a16,
            llmc_llama_mxfp4, llmc_llama_fp8, gptoss_mxfp4]


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "tests/data/ckpt")
    only = set(argv[2].split(",")) if len(argv) > 2 else None
    out.mkdir(parents=True, exist_ok=True)
    manifest_p = out / "MANIFEST.json"
    manifest = json.loads(manifest_p.read_text()) if manifest_p.exists() else {}
    import importlib.metadata as md
    vers = {p: md.version(p) for p in ("nvidia-modelopt", "llmcompressor", "compressed-tensors", "transformers",
                                       "torch", "safetensors")}
    failed = []
    for fx in FIXTURES:
        if only and fx.__name__ not in only:
            continue
        shutil.rmtree(out / fx.__name__, ignore_errors=True)
        try:
            fx(out)
            manifest[fx.__name__] = {"producer_versions": vers, "ok": True}
        except Exception as e:           # one failing producer path does not stop the others
            traceback.print_exc()
            manifest[fx.__name__] = {"producer_versions": vers, "ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
            failed.append(fx.__name__)
    manifest_p.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
