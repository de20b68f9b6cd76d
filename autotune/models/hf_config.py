"""Parse a Hugging Face config.json (file or checkpoint directory) into ArchConfig + QuantRule.

Supported (model_type, else architectures[0]): deepseek_v3 / kimi_k2 / deepseek_v32
(DeepseekV3ForCausalLM, DeepseekV32ForCausalLM), glm_moe_dsa (GlmMoeDsaForCausalLM), qwen3_moe
(Qwen3MoeForCausalLM), llama (LlamaForCausalLM), gpt_oss (GptOssForCausalLM), glm4_moe
(Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air). A wrapper config
whose model_type is unknown but whose `text_config` is supported (e.g. Kimi-K2.5) is unwrapped.

Quantization: `quantization_config` in config.json, else (for a directory) `hf_quant_config.json`
(ModelOpt; keys may sit under "quantization"), read by the loaders' own parser
(autotune.core.quant_config.detect_quant): NVFP4 / W4A16_NVFP4 / MIXED_PRECISION (ModelOpt),
compressed-tensors NVFP4 / MXFP4, gpt-oss MXFP4; excluded modules from `exclude_modules`, `ignore`
and `modules_to_not_convert` (globs or `re:` regexes), and under MIXED_PRECISION every layer that
`quantized_layers` does not name FP4. With no quantization config, or one that
is not FP4 (e.g. the FP8 of deepseek-ai/DeepSeek-V3), the checkpoint is treated as NVFP4 with the
default rule of its model_type (presets.DEFAULT_RULES); a non-FP4 one also warns.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Optional

from autotune.core import jsonread

from .arch import ArchConfig, ModelError, QuantRule
from .presets import DEFAULT_RULES, GPT_OSS_RULE

ARCHITECTURES = {
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
    "GptOssForCausalLM": "gpt_oss",
    "Glm4MoeForCausalLM": "glm4_moe",
}
MODEL_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa", "qwen3_moe", "llama", "gpt_oss", "glm4_moe")
_MISSING = object()
#: no model dimension reaches this; beyond it a problem's N or K would overflow int32 indexing
MAX_FIELD = 2**31 - 1
#: counts the parser builds lists from (one entry per layer; experts per MoE problem), bounded
#: before anything is built: the largest released models have ~100 layers and 512 experts
MAX_LAYERS = 4096
MAX_EXPERTS = 65536
COUNT_LIMITS = {"num_hidden_layers": MAX_LAYERS, "first_k_dense_replace": MAX_LAYERS, "moe_layer_freq": MAX_LAYERS,
                "decoder_sparse_step": MAX_LAYERS, "num_nextn_predict_layers": MAX_LAYERS,
                "n_routed_experts": MAX_EXPERTS, "num_experts": MAX_EXPERTS, "num_local_experts": MAX_EXPERTS,
                "num_experts_per_tok": MAX_EXPERTS, "experts_per_token": MAX_EXPERTS,
                "n_shared_experts": MAX_EXPERTS}


def resolve(path: str | os.PathLike) -> Path:
    """config.json path for a file or checkpoint directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ModelError(f"{path}: directory has no config.json")
    return p


#: a config.json is a few KiB; reading stops past this (a device file such as /dev/zero never ends)
MAX_CONFIG_BYTES = 16 << 20


def _read_json(p: Path) -> Any:
    if not p.is_file():
        raise ModelError(f"{p}: not a regular file (a config.json or a checkpoint directory)")
    try:
        return jsonread.read(p, max_bytes=MAX_CONFIG_BYTES)
    except jsonread.JSONLimitError as e:
        raise ModelError(str(e)) from None


class _Fields:
    """Typed access to one config dict; errors name the file and the field."""

    def __init__(self, d: dict, src: str, prefix: str = "") -> None:
        self.d, self.src, self.prefix = d, src, prefix

    def _err(self, field: str, msg: str) -> ModelError:
        # a plain replace, never str.format: msg holds the value's repr, which may hold braces
        return ModelError(f"{self.src}: " + msg.replace("{f}", repr(self.prefix + field), 1))

    def int(self, field: str, default: Any = _MISSING, zero: bool = False, null: Any = _MISSING) -> Any:
        v = self.d.get(field, _MISSING)
        if v is _MISSING:
            if default is _MISSING:
                raise self._err(field, "missing field {f}")
            return default
        if v is None:
            if null is _MISSING:
                raise self._err(field, "field {f} must be " + ("a non-negative" if zero else "a positive")
                                + " integer, got null")
            return null
        if isinstance(v, jsonread.HugeInt) and not v.startswith("-"):
            raise self._err(field, "field {f} = " + f"{v!r} is larger than {MAX_FIELD}, the largest size supported")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (v == 0 and not zero):
            raise self._err(field, "field {f} must be " + ("a non-negative" if zero else "a positive")
                            + f" integer, got {_shown(v)}")
        if v > MAX_FIELD:
            raise self._err(field, "field {f} = " + f"{v} is larger than {MAX_FIELD}, the largest size supported")
        limit = COUNT_LIMITS.get(field)
        if limit is not None and v > limit:
            raise self._err(field, "field {f} = " + f"{v} is more than {limit}, the most supported")
        return v

    def int_list(self, field: str) -> tuple[int, ...]:
        v = self.d.get(field) or []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            raise self._err(field, "field {f} must be a list of layer indices, got " + _shown(v))
        return tuple(v)


def _shown(v: Any) -> str:
    """A field's value for a message: short, one line (a HugeInt says how many digits it has)."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _model_type(d: dict, src: str) -> Optional[str]:
    mt = d.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise ModelError(f"{src}: field 'model_type' must be a string, got {_shown(mt)}")
    if mt in MODEL_TYPES:
        return mt
    archs = d.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ModelError(f"{src}: field 'architectures' must be a list of strings, got {archs!r}"[:200])
    for a in archs or []:
        if a in ARCHITECTURES:
            return ARCHITECTURES[a]
    return None


def parse_config(d: Any, src: str, name: str, extra_quant: Optional[dict] = None) -> tuple[ArchConfig, QuantRule]:
    """ArchConfig + QuantRule from a parsed config.json dict."""
    if not isinstance(d, dict):
        raise ModelError(f"{src}: top level must be a JSON object, got {type(d).__name__}")
    mt = _model_type(d, src)
    qc = d.get("quantization_config", _MISSING)
    if mt is None and isinstance(d.get("text_config"), dict) and _model_type(d["text_config"], src):
        inner = d["text_config"]
        if qc is _MISSING:
            qc = inner.get("quantization_config", _MISSING)
        d, mt = inner, _model_type(inner, src)
    if mt is None:
        if "model_type" not in d and "architectures" not in d:
            raise ModelError(f"{src}: missing field 'model_type'")
        raise ModelError(f"{src}: unsupported model_type {d.get('model_type')!r} / architectures "
                         f"{d.get('architectures')!r} (supported: {', '.join(MODEL_TYPES)})")
    arch = _arch(mt, _Fields(d, src), name)
    if qc is _MISSING or qc is None:
        qc = extra_quant
    return arch, _rule(mt, qc, src)


def _arch(mt: str, f: _Fields, name: str) -> ArchConfig:
    """The ArchConfig of model type `mt`: the sizes every type has, then its family's own fields."""
    hidden, layers, heads = f.int("hidden_size"), f.int("num_hidden_layers"), f.int("num_attention_heads")
    if mt in ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa"):
        return _mla_arch(mt, f, name, hidden, layers, heads)
    kv = f.int("num_key_value_heads", default=heads)
    build = {"llama": _llama_arch, "qwen3_moe": _qwen3_moe_arch, "glm4_moe": _glm4_moe_arch}.get(mt, _gpt_oss_arch)
    return build(f, name, hidden, layers, heads, kv)


def _mla_arch(mt: str, f: _Fields, name: str, hidden: int, layers: int, heads: int) -> ArchConfig:
    """DeepSeek-V3 / Kimi-K2 / V3.2 / GLM-5: MLA attention; routed + shared experts in the layers from
    first_k_dense_replace on whose index is a multiple of moe_layer_freq, the others dense; V3.2 and
    GLM-5 with the DSA indexer."""
    experts = f.int("n_routed_experts", null=0, zero=True)
    first = f.int("first_k_dense_replace", zero=True)
    freq = f.int("moe_layer_freq", default=1)
    moe = tuple(i for i in range(first, layers) if i % freq == 0) if experts else ()
    dsa = mt in ("glm_moe_dsa", "deepseek_v32")
    return ArchConfig(
        name=name, family="mla", hidden=hidden, num_layers=layers, num_heads=heads,
        intermediate=f.int("intermediate_size") if len(moe) < layers else f.int("intermediate_size", default=0),
        moe_layers=moe, experts=experts,
        top_k=f.int("num_experts_per_tok") if moe else 0,
        moe_intermediate=f.int("moe_intermediate_size") if moe else 0,
        shared_experts=f.int("n_shared_experts", null=0, zero=True) if moe else 0,
        q_lora_rank=f.int("q_lora_rank", null=None), kv_lora_rank=f.int("kv_lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim"), qk_rope_head_dim=f.int("qk_rope_head_dim"),
        v_head_dim=f.int("v_head_dim"),
        # DSA indexer: 32 heads × 128 when the config omits them (GLM-5 / V3.2 values)
        index_heads=f.int("index_n_heads", default=32) if dsa else 0,
        index_head_dim=f.int("index_head_dim", default=128) if dsa else 0,
        mtp_layers=f.int("num_nextn_predict_layers", default=0, zero=True))


def _llama_arch(f: _Fields, name: str, hidden: int, layers: int, heads: int, kv: int) -> ArchConfig:
    """Llama: GQA attention, every layer a dense MLP."""
    return ArchConfig(name=name, family="gqa", hidden=hidden, num_layers=layers, num_heads=heads,
                      num_kv_heads=kv, head_dim=f.int("head_dim", default=hidden // heads, null=hidden // heads),
                      intermediate=f.int("intermediate_size"))


def _qwen3_moe_arch(f: _Fields, name: str, hidden: int, layers: int, heads: int, kv: int) -> ArchConfig:
    """Qwen3-MoE: GQA attention, routed experts every decoder_sparse_step-th layer but those of
    mlp_only_layers (dense)."""
    # transformers 5.x writes the expert count as num_local_experts (4.x: num_experts)
    experts = f.int("num_experts", zero=True) if "num_experts" in f.d else f.int("num_local_experts", zero=True)
    step = f.int("decoder_sparse_step", default=1)
    only = set(f.int_list("mlp_only_layers"))
    moe = tuple(i for i in range(layers) if experts and i not in only and (i + 1) % step == 0)
    return ArchConfig(
        name=name, family="gqa", hidden=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=f.int("head_dim", default=hidden // heads, null=hidden // heads),
        intermediate=f.int("intermediate_size") if len(moe) < layers else f.int("intermediate_size", default=0),
        moe_layers=moe, experts=experts, top_k=f.int("num_experts_per_tok") if moe else 0,
        moe_intermediate=f.int("moe_intermediate_size") if moe else 0)


def _glm4_moe_arch(f: _Fields, name: str, hidden: int, layers: int, heads: int, kv: int) -> ArchConfig:
    """GLM-4.5 / 4.5-Air (transformers Glm4MoeConfig): GQA attention (with biases), the first
    first_k_dense_replace layers dense, then routed + shared experts; MTP layers recorded only."""
    experts = f.int("n_routed_experts", zero=True)
    first = f.int("first_k_dense_replace", zero=True)
    moe = tuple(range(first, layers)) if experts else ()
    return ArchConfig(
        name=name, family="gqa", hidden=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=f.int("head_dim", default=hidden // heads, null=hidden // heads),
        intermediate=f.int("intermediate_size") if len(moe) < layers else f.int("intermediate_size", default=0),
        moe_layers=moe, experts=experts, top_k=f.int("num_experts_per_tok") if moe else 0,
        moe_intermediate=f.int("moe_intermediate_size") if moe else 0,
        shared_experts=f.int("n_shared_experts", null=0, zero=True, default=0) if moe else 0,
        mtp_layers=f.int("num_nextn_predict_layers", default=0, zero=True))


def _gpt_oss_arch(f: _Fields, name: str, hidden: int, layers: int, heads: int, kv: int) -> ArchConfig:
    """gpt-oss: every layer MoE, expert intermediate = intermediate_size, sharded in whole 32-element
    MX blocks (vLLM's MXFP4 loader)."""
    experts = f.int("num_local_experts")
    top_k = f.int("num_experts_per_tok") if "num_experts_per_tok" in f.d else f.int("experts_per_token")
    return ArchConfig(
        name=name, family="gpt_oss", hidden=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=f.int("head_dim", default=64), moe_layers=tuple(range(layers)), experts=experts,
        top_k=top_k, moe_intermediate=f.int("intermediate_size"), mx_block_shard=True)


def _strings(q: dict, key: str, src: str) -> tuple[str, ...]:
    v = q.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ModelError(f"{src}: field 'quantization_config.{key}' must be a list of strings")
    return tuple(v)


def _rule(mt: str, qc: Any, src: str) -> QuantRule:
    """The planning rule from the one parser the loaders use (autotune.core.quant_config), so a
    layer is planned FP4 exactly where it is served FP4."""
    from autotune.core.quant_config import CheckpointError, detect_quant
    default = DEFAULT_RULES[mt]
    if qc is None:
        return default
    if not isinstance(qc, dict):
        raise ModelError(f"{src}: field 'quantization_config' must be an object, got {type(qc).__name__}")
    for key in ("exclude_modules", "ignore", "modules_to_not_convert"):     # typed here: one line naming the field
        for q in (qc, qc.get("quantization") if isinstance(qc.get("quantization"), dict) else {}):
            _strings(q, key, src)
    hq = qc if isinstance(qc.get("quantization"), dict) or "producer" in qc else None
    try:
        scheme = detect_quant(None if hq is not None else {"quantization_config": qc}, hq, src)
    except CheckpointError as e:
        q = {**qc, **(qc["quantization"] if isinstance(qc.get("quantization"), dict) else {})}
        warnings.warn(f"{src}: quantization_config ({q.get('quant_method') or q.get('quant_algo')!r}) is not "
                      f"NVFP4/MXFP4 as the loaders read it ({str(e).split(': ', 1)[-1][:160]}); using the default "
                      f"{default.fmt} rule ({default.source})", stacklevel=4)
        return default
    if mt == "gpt_oss" and scheme.fmt == "mxfp4":
        return GPT_OSS_RULE   # the HF/vLLM MXFP4 path converts only the expert tensors
    exclude = scheme.exclude
    if scheme.layers:       # MIXED_PRECISION: only the layers quantized_layers names FP4 are FP4
        fp4 = [re.escape(n) for n, a in scheme.layers if scheme.fp4_layer(n)]
        exclude += (f"re:(?!(?:{'|'.join(fp4)})(?:\\..*)?$)",)
        other = scheme.not_fp4()
        if other:
            algos = sorted({a for n, a in scheme.layers if n in set(other)})
            warnings.warn(f"{src}: {len(other)} layer(s) are {', '.join(algos)} in quantized_layers "
                          f"(ModelOpt MIXED_PRECISION; e.g. {other[0]}): neither planned nor served as FP4",
                          stacklevel=4)
    weight_only = tuple(n for n, a in scheme.layers if scheme.fp4_layer(n) and not scheme.layer_w4a4(n))
    return QuantRule(scheme.fmt, None, exclude, source=src, w4a4=scheme.w4a4, weight_only=weight_only)


def load(path: str | os.PathLike) -> tuple[ArchConfig, QuantRule]:
    """ArchConfig + QuantRule of an HF config.json or a checkpoint directory holding one."""
    p = resolve(path)
    extra = None
    side = p.parent / "hf_quant_config.json"
    if side.is_file():
        extra = _read_json(side)
        if not isinstance(extra, dict):
            raise ModelError(f"{side}: top level must be a JSON object")
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return parse_config(_read_json(p), str(p), name or str(p), extra)
