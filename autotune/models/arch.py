"""Architecture config + quantization rule: the two values a preset or an HF config.json becomes.

`ArchConfig` holds only what decides GEMM shapes (hidden size, layer kinds, MLP / expert
sizes, attention dims). `QuantRule` decides which linear layers the FP4 checkpoint quantizes,
either by role (preset default) or by module-name exclusion patterns (read from a checkpoint's
`quantization_config`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


class ModelError(ValueError):
    """A model name, config.json or sharding request that cannot be turned into problems."""


# --- layer roles -------------------------------------------------------------------------------
# MLA attention (DeepSeek-V3 / Kimi-K2 / GLM-5)
ATTN_QKV_A = "attn_qkv_a"        # q_a_proj ⊕ kv_a_proj_with_mqa, replicated (vLLM disable_tp)
ATTN_Q = "attn_q"                # q_proj when q_lora_rank is null, column
ATTN_KV_A = "attn_kv_a"          # kv_a_proj_with_mqa when q_lora_rank is null, replicated
ATTN_Q_B = "attn_q_b"            # column
ATTN_KV_B = "attn_kv_b"          # column (prefill / MHA path)
INDEXER_WQ_B = "indexer_wq_b"    # DSA indexer, replicated
INDEXER_WK = "indexer_wk"        # wk ⊕ weights_proj, replicated, always unquantized in vLLM
# GQA attention (Llama / Qwen3 / gpt-oss)
ATTN_QKV = "attn_qkv"            # q ⊕ k ⊕ v, column by heads (kv heads replicated when kv < tp)
# both
ATTN_O = "attn_o"                # row
# MLP
MLP_GATE_UP = "mlp_gate_up"      # dense MLP, column
MLP_DOWN = "mlp_down"            # dense MLP, row
SHARED_GATE_UP = "shared_gate_up"
SHARED_DOWN = "shared_down"
EXPERTS_W13 = "experts_w13"      # routed experts, grouped MoE
EXPERTS_W2 = "experts_w2"

MLP_ROLES = frozenset({MLP_GATE_UP, MLP_DOWN})
SHARED_ROLES = frozenset({SHARED_GATE_UP, SHARED_DOWN})
EXPERT_ROLES = frozenset({EXPERTS_W13, EXPERTS_W2})
#: roles vLLM never quantizes whatever the checkpoint says
NEVER_QUANTIZED = frozenset({INDEXER_WK})


@dataclass(frozen=True)
class ArchConfig:
    """GEMM-relevant architecture of a decoder-only LLM (full, unsharded sizes).

    family: "mla" (DeepSeek-V3 style attention + per-expert modules), "gqa" (Llama / Qwen3-MoE),
    or "gpt_oss" (GQA + fused expert tensors). Layers not in `moe_layers` are dense-MLP layers.
    MTP / next-n layers (`mtp_layers`) are recorded but never produce problems: they run only
    with speculative decoding and NVIDIA's checkpoints leave them BF16.
    """
    name: str
    family: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int = 0            # GQA
    head_dim: int = 0                # GQA
    intermediate: int = 0            # dense MLP intermediate (0 when there is no dense layer)
    moe_layers: tuple[int, ...] = ()
    experts: int = 0                 # routed experts
    top_k: int = 0
    moe_intermediate: int = 0        # per routed expert
    shared_experts: int = 0          # shared expert intermediate = shared_experts * moe_intermediate
    q_lora_rank: Optional[int] = None  # MLA
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_heads: int = 0             # DSA indexer (0 = none)
    index_head_dim: int = 0
    mtp_layers: int = 0
    #: routed-expert intermediate is sharded in whole 32-element MX blocks (vLLM gpt-oss MXFP4
    #: loader: per rank cdiv(I/32, tp)·32, last rank shorter) instead of requiring I % tp == 0
    mx_block_shard: bool = False

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.num_layers) if i not in moe)


@dataclass(frozen=True)
class QuantRule:
    """Which linear layers the FP4 checkpoint quantizes, and in which format.

    With `roles` set (preset / default rule) a layer is quantized iff its role is listed.
    Otherwise (rule read from a quantization_config) every linear layer is quantized unless one
    of its HF module names matches an `exclude` pattern. Patterns: `re:REGEX` (compressed-tensors
    style, re.match), else a glob where `*` matches anything; a glob also matches a module whose
    dotted name ends with it (`lm_head`) or lies under it (`model.layers.*.self_attn`).
    """
    fmt: str = "nvfp4"
    roles: Optional[frozenset[str]] = None
    exclude: tuple[str, ...] = ()
    source: str = "default"
    #: the checkpoint carries static activation scales (W4A4 in the engines); whether a search
    #: tunes the W4A4 problems is the caller's choice (autotune.runtime.activations)
    w4a4: bool = False
    #: MIXED_PRECISION: modules (and what lies under them) FP4 weight-only although `w4a4`
    weight_only: tuple[str, ...] = ()

    def layer_w4a4(self, modules: tuple[str, ...]) -> bool:
        """The checkpoint carries static activation scales for these modules."""
        return self.w4a4 and not any(m == n or m.startswith(n + ".") for m in modules for n in self.weight_only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rx", _compile(self.exclude, self.source))

    def excluded(self, module: str) -> bool:
        rx = self._rx  # type: ignore[attr-defined]
        return bool(rx is not None and rx.fullmatch(module))

    def quantized(self, role: str, modules: tuple[str, ...], where: str) -> bool:
        if role in NEVER_QUANTIZED:
            return False
        if self.roles is not None:
            return role in self.roles
        hits = [self.excluded(m) for m in modules]
        if all(hits):
            return False
        if any(hits):
            parts = ", ".join(m for m, h in zip(modules, hits) if h)
            raise ModelError(f"{self.source}: fused layer {where} is only partly excluded from quantization ({parts})")
        return True


def _compile(patterns: tuple[str, ...], source: str) -> Optional[re.Pattern]:
    if not patterns:
        return None
    alts = []
    for p in patterns:
        if p.startswith("re:"):
            body = p[3:]
            try:
                re.compile(body)
            except re.error as e:
                raise ModelError(f"{source}: bad regex exclusion pattern {p!r} ({e})") from None
            alts.append(f"(?:{body}).*")
        else:
            core = ".*".join(".".join(re.escape(s) for s in part.split("?")) for part in p.split("*"))
            alts.append(rf"(?:.*\.)?{core}(?:\..*)?")
    return re.compile("|".join(f"(?:{a})" for a in alts), re.DOTALL)
