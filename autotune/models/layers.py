"""Per-GPU GEMM problems of one model under TP / EP sharding (vLLM / SGLang rules, models.md §3).

Sharding implemented (tp = tensor-parallel size, ep = expert-parallel size):
  * column-parallel (q_b_proj, kv_b_proj, dense / shared gate_up): N / tp;
    GQA qkv: q heads / tp, kv heads / tp, or one replicated kv head per rank when kv < tp.
  * row-parallel (o_proj, dense / shared down): K / tp.
  * replicated (fused_qkv_a_proj, indexer wq_b / wk+weights_proj): unchanged.
  * routed experts (grouped MoE): E_local = E / ep whole experts, moe_tp = tp / ep;
    w13 N = 2·I_e / moe_tp, w2 K = I_e / moe_tp. ep=1 → every expert, I_e sharded by tp;
    ep=tp → E/tp whole experts at full I_e (vLLM --enable-expert-parallel, SGLang DeepEP).
    Requires ep | E and ep | tp. gpt-oss (MXFP4) shards I_e in whole 32-element blocks.
  * shared experts and dense MLPs stay tensor-parallel over tp even with EP (vLLM).
Shared experts are separate dense problems; with fold_shared also, where the shared expert has the
routed experts' per-expert shape, the folded forms FP4MoE(shared=...) runs. With fused_mlp the dense
and shared gate_up also in their `swiglu` form, what FP4MLP runs (gate_up with SiLU·up in its kernel).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from autotune.core.problem import BLOCK, Problem

from .arch import (ATTN_KV_A, ATTN_KV_B, ATTN_O, ATTN_Q, ATTN_Q_B, ATTN_QKV, ATTN_QKV_A, EXPERTS_W2,
                   EXPERTS_W13, INDEXER_WK, INDEXER_WQ_B, MLP_DOWN, MLP_GATE_UP, SHARED_DOWN,
                   SHARED_GATE_UP, ArchConfig, ModelError, QuantRule)


@dataclass(frozen=True)
class ProblemUse:
    """One distinct per-GPU GEMM and the layers that run it."""
    problem: Problem
    layers: tuple[str, ...]   # e.g. ("mlp.gate_up_proj[0-2]",) or ("mlp.experts.w13[3-77]",)
    per_forward: int          # runs per forward pass on one GPU (MoE: one grouped GEMM per layer)


@dataclass(frozen=True)
class _Linear:
    role: str
    name: str                 # display name relative to a decoder layer
    parts: tuple[str, ...]    # HF module names relative to "model.layers.{i}."
    layers: tuple[int, ...]


def _check_par(tp: int, ep: int) -> None:
    for name, v in (("tp", tp), ("ep", ep)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelError(f"{name} must be a positive integer, got {v!r}")


def _linears(a: ArchConfig) -> Iterator[_Linear]:
    every = tuple(range(a.num_layers))
    if a.family == "mla":
        if a.q_lora_rank:
            yield _Linear(ATTN_QKV_A, "self_attn.fused_qkv_a_proj",
                          ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"), every)
            yield _Linear(ATTN_Q_B, "self_attn.q_b_proj", ("self_attn.q_b_proj",), every)
        else:
            yield _Linear(ATTN_Q, "self_attn.q_proj", ("self_attn.q_proj",), every)
            yield _Linear(ATTN_KV_A, "self_attn.kv_a_proj_with_mqa", ("self_attn.kv_a_proj_with_mqa",), every)
        yield _Linear(ATTN_KV_B, "self_attn.kv_b_proj", ("self_attn.kv_b_proj",), every)
        yield _Linear(ATTN_O, "self_attn.o_proj", ("self_attn.o_proj",), every)
        if a.index_heads:
            yield _Linear(INDEXER_WQ_B, "self_attn.indexer.wq_b", ("self_attn.indexer.wq_b",), every)
            yield _Linear(INDEXER_WK, "self_attn.indexer.wk+weights_proj",
                          ("self_attn.indexer.wk", "self_attn.indexer.weights_proj"), every)
    else:
        yield _Linear(ATTN_QKV, "self_attn.qkv_proj",
                      ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), every)
        yield _Linear(ATTN_O, "self_attn.o_proj", ("self_attn.o_proj",), every)
    dense = a.dense_layers
    if dense:
        yield _Linear(MLP_GATE_UP, "mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"), dense)
        yield _Linear(MLP_DOWN, "mlp.down_proj", ("mlp.down_proj",), dense)
    if a.moe_layers and a.shared_experts:
        yield _Linear(SHARED_GATE_UP, "mlp.shared_experts.gate_up_proj",
                      ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"), a.moe_layers)
        yield _Linear(SHARED_DOWN, "mlp.shared_experts.down_proj", ("mlp.shared_experts.down_proj",), a.moe_layers)
    if a.moe_layers:
        if a.family == "gpt_oss":   # fused expert tensors; the rule is checked on them
            w13, w2 = ("mlp.experts.gate_up_proj",), ("mlp.experts.down_proj",)
        else:                       # per-expert modules; the rule is checked on expert 0
            w13, w2 = ("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj"), ("mlp.experts.0.down_proj",)
        yield _Linear(EXPERTS_W13, "mlp.experts.w13", w13, a.moe_layers)
        yield _Linear(EXPERTS_W2, "mlp.experts.w2", w2, a.moe_layers)


def _div(a: ArchConfig, layer: str, what: str, value: int, by: str, d: int) -> int:
    if value % d:
        raise ModelError(f"{a.name} {layer}: {what}={value} is not divisible by {by}={d}")
    return value // d


def _mx_inters(a: ArchConfig, lin: _Linear, moe_tp: int) -> list[int]:
    """Each rank's routed-expert intermediate when it is split in whole MX blocks (vLLM's gpt-oss
    loader: cdiv(I/32, tp) blocks per rank, the last rank shorter), distinct, first rank first."""
    blk = BLOCK["mxfp4"]
    blocks = _div(a, lin.name, "moe_intermediate_size", a.moe_intermediate, "MX block", blk)
    per = -(-blocks // moe_tp)
    out: list[int] = []
    for r in range(moe_tp):
        n = min(per, blocks - r * per) * blk
        if n <= 0:
            raise ModelError(f"{a.name} {lin.name}: {blocks} MX blocks of moe_intermediate_size leave rank {r} of "
                             f"tp/ep={moe_tp} no block (vLLM's whole-block split)")
        if n not in out:
            out.append(n)
    return out


def _shapes(a: ArchConfig, lin: _Linear, tp: int, ep: int, fmt: str) -> list[Problem]:
    """The per-GPU Problems of one linear layer over every rank: one, except where ranks get
    different shapes (an uneven whole-MX-block split of the routed experts)."""
    if a.mx_block_shard and lin.role in (EXPERTS_W13, EXPERTS_W2):
        return [_shape(a, lin, tp, ep, fmt, inter) for inter in _mx_inters(a, lin, tp // ep)]
    return [_shape(a, lin, tp, ep, fmt)]


def _shape(a: ArchConfig, lin: _Linear, tp: int, ep: int, fmt: str, mx_inter: int | None = None) -> Problem:
    """The per-GPU Problem of one linear layer (raises ModelError naming the layer); mx_inter: one
    rank's routed-expert intermediate under a whole-MX-block split (_mx_inters)."""
    moe = None
    if lin.role in (EXPERTS_W13, EXPERTS_W2):
        k, n, moe = _experts_kn(a, lin, tp, ep, mx_inter)
    elif lin.role in (MLP_GATE_UP, MLP_DOWN, SHARED_GATE_UP, SHARED_DOWN):
        k, n = _mlp_kn(a, lin, tp)
    else:
        k, n = _attention_kn(a, lin, tp)
    try:
        if moe:
            return Problem.moe(n, k, experts=moe[0], top_k=moe[1], w_fmt=fmt)
        return Problem.dense(n, k, w_fmt=fmt)
    except ValueError as e:
        raise ModelError(f"{a.name} {lin.name}: {e}") from None


def _attention_kn(a: ArchConfig, lin: _Linear, tp: int) -> tuple[int, int]:
    """(K, N) per GPU of an attention or DSA indexer projection (MLA or GQA), heads split over tp."""
    h, nm = a.hidden, lin.name
    heads = lambda: _div(a, nm, "num_attention_heads", a.num_heads, "tp", tp)  # noqa: E731
    r = lin.role
    if r == ATTN_QKV_A:
        return h, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim
    if r == ATTN_Q:
        return h, heads() * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    if r == ATTN_KV_A:
        return h, a.kv_lora_rank + a.qk_rope_head_dim
    if r == ATTN_Q_B:
        return a.q_lora_rank, heads() * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    if r == ATTN_KV_B:
        return a.kv_lora_rank, heads() * (a.qk_nope_head_dim + a.v_head_dim)
    if r == INDEXER_WQ_B:
        return a.q_lora_rank, a.index_heads * a.index_head_dim
    if r == INDEXER_WK:
        return h, a.index_head_dim + a.index_heads
    if r == ATTN_QKV:
        if a.num_kv_heads >= tp:
            kv = _div(a, nm, "num_key_value_heads", a.num_kv_heads, "tp", tp)
        else:   # each rank keeps one replicated kv head; vLLM needs tp % kv == 0
            _div(a, nm, "tp", tp, "num_key_value_heads", a.num_kv_heads)
            kv = 1
        return h, (heads() + 2 * kv) * a.head_dim
    if r == ATTN_O:
        v = a.v_head_dim if a.family == "mla" else a.head_dim
        return heads() * v, h
    raise AssertionError(r)  # pragma: no cover


def _mlp_kn(a: ArchConfig, lin: _Linear, tp: int) -> tuple[int, int]:
    """(K, N) per GPU of a dense MLP or shared-expert projection, the intermediate split over tp."""
    h, nm, r = a.hidden, lin.name, lin.role
    if r == MLP_GATE_UP:
        return h, 2 * _div(a, nm, "intermediate_size", a.intermediate, "tp", tp)
    if r == MLP_DOWN:
        return _div(a, nm, "intermediate_size", a.intermediate, "tp", tp), h
    if r == SHARED_GATE_UP:
        return h, 2 * _div(a, nm, "shared intermediate", a.shared_experts * a.moe_intermediate, "tp", tp)
    return _div(a, nm, "shared intermediate", a.shared_experts * a.moe_intermediate, "tp", tp), h   # SHARED_DOWN


def _experts_kn(a: ArchConfig, lin: _Linear, tp: int, ep: int,
                mx_inter: int | None) -> tuple[int, int, tuple[int, int]]:
    """(K, N, (local experts, top_k)) per GPU of the routed experts' w13 or w2: experts split over
    ep, the intermediate over tp/ep (in whole MX blocks where the model shards so)."""
    e_local = _div(a, lin.name, "routed experts", a.experts, "ep", ep)
    moe_tp = tp // ep
    if a.mx_block_shard:
        inter = mx_inter if mx_inter is not None else _mx_inters(a, lin, moe_tp)[0]
    else:
        inter = _div(a, lin.name, "moe_intermediate_size", a.moe_intermediate, "tp/ep", moe_tp)
    k, n = (a.hidden, 2 * inter) if lin.role == EXPERTS_W13 else (inter, a.hidden)
    return k, n, (e_local, a.top_k)


def _ranges(idx: list[int]) -> str:
    out, start, prev = [], None, None
    for i in sorted(set(idx)):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return "[" + ",".join(out) + "]"


def build_problems(a: ArchConfig, rule: QuantRule, tp: int = 1, ep: int = 1,
                   include_attention: bool = False, fused_moe: bool = False,
                   fold_shared: bool = False, act=None, fused_mlp: bool = False) -> list[ProblemUse]:
    """Deduplicated per-GPU problems, sorted by Problem (kind, formats, n, k, experts, top_k).
    fused_moe: also the fused forms of the routed experts (w13 with the SwiGLU epilogue, w2 with
    the routing weights applied and top_k summed: what FP4MoE runs by default), as their own
    problems beside the plain ones (alternatives, not extra GEMMs per forward).
    fold_shared: also the routed problems with the shared expert folded in as one more, always
    routed expert, moe(n, k, E+1, top_k+1) (and their fused forms with fused_moe), in the layers
    where the shared expert is quantized and has the routed experts' per-expert (N, K).
    fused_mlp: also the dense MLP's and the shared expert's gate_up with the SwiGLU epilogue
    (`...:swiglu`, [M, N/2]: what FP4MLP runs, then the plain down), beside the plain gate_up.
    act: for a W4A4 checkpoint (rule.w4a4), Problem -> Problem choosing each quantized layer's
    activation format (autotune.runtime.activations.choose, bound to an arch and the setting);
    None keeps every problem W4A16."""
    _check_par(tp, ep)
    if ep > 1:
        if not a.moe_layers or not a.experts:
            raise ModelError(f"ep={ep} given but {a.name} has no routed experts")
        if tp % ep:
            raise ModelError(f"tp={tp} is not a multiple of ep={ep} (MoE TP size = tp / ep)")
        _div(a, "mlp.experts", "routed experts", a.experts, "ep", ep)
    groups: dict[Problem, dict[str, list[int]]] = {}
    shared: dict[str, tuple[Problem, set[int]]] = {}
    for lin in _linears(a):
        use = [i for i in lin.layers
               if rule.quantized(lin.role, tuple(f"model.layers.{i}.{p}" for p in lin.parts),
                                 f"model.layers.{i}.{lin.name}")]
        quantized = bool(use)
        if include_attention:
            # every linear layer (attention, indexer, and any MLP the checkpoint left BF16), in the
            # checkpoint's FP4 format: tuned as if quantized. lm_head / router never appear here.
            use = list(lin.layers)
        if not use:
            continue
        for p in _shapes(a, lin, tp, ep, rule.fmt):      # every rank's shape (uneven splits: more than one)
            w4a4 = quantized and rule.layer_w4a4(tuple(f"model.layers.{use[0]}.{q}" for q in lin.parts))
            _add(groups, shared, a, lin, p, use, w4a4, act, fused_moe, fold_shared, fused_mlp)
    out = []
    for p in sorted(groups):
        names = groups[p]
        out.append(ProblemUse(p, tuple(f"{n}{_ranges(ix)}" for n, ix in names.items()),
                              sum(len(set(ix)) for ix in names.values())))
    return out


def _add(groups: dict, shared: dict, a: ArchConfig, lin: _Linear, p: Problem, use: list[int], w4a4: bool,
         act, fused_moe: bool, fold_shared: bool, fused_mlp: bool) -> None:
    """Record one per-GPU problem of `lin` (and the forms the runtime serves it in) in `groups`;
    w4a4: the checkpoint carries this layer's static activation scales (a BF16-kept or weight-only
    layer has none)."""
    if act is not None and w4a4:
        p = act(p)
    groups.setdefault(p, {}).setdefault(lin.name, []).extend(use)
    if lin.role in (SHARED_GATE_UP, SHARED_DOWN):
        shared[lin.role] = (p, set(use), w4a4)
    if fused_mlp and lin.role in (MLP_GATE_UP, SHARED_GATE_UP) and p.a_fmt == "bf16":
        groups.setdefault(p.variant("swiglu"), {}).setdefault(f"{lin.name}+swiglu", []).extend(use)
    if lin.role not in (EXPERTS_W13, EXPERTS_W2):
        return
    epi = "swiglu" if lin.role == EXPERTS_W13 else "reduce"
    # gpt-oss's clamped SwiGLU (with biases) has no fused epilogue: FP4MoE runs it unfused, so its
    # fused forms are never served and never planned
    fusable = a.family != "gpt_oss"
    if fused_moe and fusable:
        groups.setdefault(p.variant(epi), {}).setdefault(f"{lin.name}+{epi}", []).extend(use)
    sp, s_use, s_w4a4 = shared.get(SHARED_GATE_UP if lin.role == EXPERTS_W13 else SHARED_DOWN, (None, set(), False))
    both = [i for i in use if i in s_use]
    # folded only where the shared expert has the routed experts' shape and the checkpoint gives
    # both the same activation format (FP4MoE runs a shared expert of another format apart)
    if fold_shared and sp is not None and (sp.n, sp.k, s_w4a4) == (p.n, p.k, w4a4) and both:
        f = replace(p, experts=p.experts + 1, top_k=p.top_k + 1)
        groups.setdefault(f, {}).setdefault(f"{lin.name}+shared", []).extend(both)
        if fused_moe and fusable:
            groups.setdefault(f.variant(epi), {}).setdefault(f"{lin.name}+shared+{epi}", []).extend(both)
