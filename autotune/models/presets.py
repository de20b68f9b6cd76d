"""Built-in models: architecture config + default NVFP4/MXFP4 quantization rule.

Numbers from the project reference models.md (HF config.json of each model). The default rules
follow the NVIDIA checkpoints listed there; `DEFAULT_RULES` is also used for an HF config.json
that has no (FP4) quantization_config, keyed by model_type.
"""
from __future__ import annotations

from .arch import (ATTN_O, ATTN_QKV, EXPERT_ROLES, MLP_ROLES, SHARED_ROLES, ArchConfig, QuantRule)

#: nvidia/GLM-5-NVFP4: dense MLP 0–2 + shared + routed experts; all attention, indexer,
#: lm_head and the MTP layer 78 stay BF16. (GLM-5.1/5.2-NVFP4 would be routed experts only.)
GLM5_RULE = QuantRule("nvfp4", MLP_ROLES | SHARED_ROLES | EXPERT_ROLES, source="glm5 default (nvidia/GLM-5-NVFP4)")
#: nvidia/DeepSeek-V3.1-NVFP4 excludes lm_head, q_a, q_b, kv_a, kv_b and layer 61 (MTP)
#: ⇒ o_proj + dense MLP + shared + routed experts are NVFP4.
DEEPSEEK_V3_RULE = QuantRule("nvfp4", MLP_ROLES | SHARED_ROLES | EXPERT_ROLES | {ATTN_O},
                             source="deepseek-v3 default (nvidia/DeepSeek-V3.1-NVFP4)")
#: nvidia/DeepSeek-V3.2-NVFP4 also excludes all self_attn* and indexer* ⇒ same set as GLM-5.
DEEPSEEK_V32_RULE = QuantRule("nvfp4", MLP_ROLES | SHARED_ROLES | EXPERT_ROLES,
                              source="deepseek-v3.2 default (nvidia/DeepSeek-V3.2-NVFP4)")
#: nvidia/Kimi-K2.6-NVFP4 / K2.7-Code-NVFP4: routed experts only (K2.5-NVFP4 also quantized the
#: layer-0 dense MLP and the shared experts).
KIMI_K2_RULE = QuantRule("nvfp4", EXPERT_ROLES, source="kimi-k2 default (nvidia/Kimi-K2.6-NVFP4)")
#: nvidia/Qwen3-*-NVFP4 exclude only lm_head and mlp.gate (router) ⇒ qkv, o and experts.
QWEN3_MOE_RULE = QuantRule("nvfp4", EXPERT_ROLES | {ATTN_QKV, ATTN_O}, source="qwen3-moe default (nvidia/Qwen3-*-NVFP4)")
#: openai/gpt-oss: quant_method mxfp4, modules_to_not_convert = self_attn, router, embeddings,
#: lm_head ⇒ MXFP4 experts only.
GPT_OSS_RULE = QuantRule("mxfp4", EXPERT_ROLES, source="gpt-oss default (openai/gpt-oss MXFP4)")
#: UNCONFIRMED: the NVFP4 Llama-3.1 exclusion list was not read (models.md: U). We assume the
#: FP8 checkpoint's rule (everything but lm_head): qkv, o, gate_up and down are quantized.
LLAMA_RULE = QuantRule("nvfp4", MLP_ROLES | {ATTN_QKV, ATTN_O}, source="llama default (assumed: all but lm_head)")

#: default rule per HF model_type (used for a config.json without an FP4 quantization_config)
#: GLM-4.5 / GLM-4.5-Air (glm4_moe): no NVIDIA NVFP4 export read; a config without an FP4
#: quantization_config is planned with its MLPs, shared and routed experts NVFP4, attention BF16
GLM4_MOE_RULE = QuantRule("nvfp4", MLP_ROLES | SHARED_ROLES | EXPERT_ROLES,
                          source="glm4_moe default (dense MLP + shared + routed experts)")

DEFAULT_RULES: dict[str, QuantRule] = {
    "glm4_moe": GLM4_MOE_RULE,
    "glm_moe_dsa": GLM5_RULE,
    "deepseek_v3": DEEPSEEK_V3_RULE,
    "deepseek_v32": DEEPSEEK_V32_RULE,
    "kimi_k2": KIMI_K2_RULE,
    "qwen3_moe": QWEN3_MOE_RULE,
    "gpt_oss": GPT_OSS_RULE,
    "llama": LLAMA_RULE,
}


def _moe(first_dense: int, layers: int) -> tuple[int, ...]:
    return tuple(range(first_dense, layers))


PRESETS: dict[str, tuple[ArchConfig, QuantRule]] = {
    # zai-org/GLM-5: 78 layers (+1 MTP), 0–2 dense, MLA + DSA indexer
    "glm5": (ArchConfig(
        name="glm5", family="mla", hidden=6144, num_layers=78, num_heads=64, intermediate=12288,
        moe_layers=_moe(3, 78), experts=256, top_k=8, moe_intermediate=2048, shared_experts=1,
        q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
        index_heads=32, index_head_dim=128, mtp_layers=1), GLM5_RULE),
    # deepseek-ai/DeepSeek-V3 / R1: 61 layers (+1 MTP), 0–2 dense
    "deepseek-v3": (ArchConfig(
        name="deepseek-v3", family="mla", hidden=7168, num_layers=61, num_heads=128, intermediate=18432,
        moe_layers=_moe(3, 61), experts=256, top_k=8, moe_intermediate=2048, shared_experts=1,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        mtp_layers=1), DEEPSEEK_V3_RULE),
    # moonshotai/Kimi-K2-Instruct: DeepseekV3 arch, 61 layers, layer 0 dense, 384 experts, 64 heads
    "kimi-k2": (ArchConfig(
        name="kimi-k2", family="mla", hidden=7168, num_layers=61, num_heads=64, intermediate=18432,
        moe_layers=_moe(1, 61), experts=384, top_k=8, moe_intermediate=2048, shared_experts=1,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        KIMI_K2_RULE),
    # Qwen/Qwen3-235B-A22B: 94 layers all MoE, 64 q / 4 kv heads
    "qwen3-235b-a22b": (ArchConfig(
        name="qwen3-235b-a22b", family="gqa", hidden=4096, num_layers=94, num_heads=64, num_kv_heads=4,
        head_dim=128, moe_layers=_moe(0, 94), experts=128, top_k=8, moe_intermediate=1536), QWEN3_MOE_RULE),
    # Qwen/Qwen3-30B-A3B: 48 layers all MoE, 32 q / 4 kv heads
    "qwen3-30b-a3b": (ArchConfig(
        name="qwen3-30b-a3b", family="gqa", hidden=2048, num_layers=48, num_heads=32, num_kv_heads=4,
        head_dim=128, moe_layers=_moe(0, 48), experts=128, top_k=8, moe_intermediate=768), QWEN3_MOE_RULE),
    # openai/gpt-oss-120b: 36 layers all MoE, 64 q / 8 kv heads × 64, 128 experts top-4, MXFP4
    "gpt-oss-120b": (ArchConfig(
        name="gpt-oss-120b", family="gpt_oss", hidden=2880, num_layers=36, num_heads=64, num_kv_heads=8,
        head_dim=64, moe_layers=_moe(0, 36), experts=128, top_k=4, moe_intermediate=2880,
        mx_block_shard=True), GPT_OSS_RULE),
    # meta-llama/Llama-3.1-70B
    "llama-3.1-70b": (ArchConfig(
        name="llama-3.1-70b", family="gqa", hidden=8192, num_layers=80, num_heads=64, num_kv_heads=8,
        head_dim=128, intermediate=28672), LLAMA_RULE),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": (ArchConfig(
        name="llama-3.1-8b", family="gqa", hidden=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate=14336), LLAMA_RULE),
}


def list_models() -> list[str]:
    """Names of the built-in presets."""
    return list(PRESETS)


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-")
