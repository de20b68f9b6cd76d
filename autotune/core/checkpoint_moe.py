"""MoE experts from a checkpoint (autotune.core.checkpoint): per-expert modules, ModelOpt's
stacked bmm experts and gpt-oss's MXFP4 `*_blocks`, stacked as the engines stack them, for this
rank's experts and intermediate slice."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from autotune.core.checkpoint import Checkpoint, shard_range
from autotune.core.formats import FORMATS, FP4Weight
from autotune.core.quant_config import CheckpointError

__all__ = ["ExpertWeights", "read_experts", "gate_up_split", "cat_rows"]


@dataclass
class ExpertWeights:
    """Routed experts of one MoE block as the engines stack them (this rank's experts and slice).

    w13 [E, 2I, H] and w2 [E, H, I]; `experts` the global ids in local order, `num_global` the
    block's expert count; `layout` the checkpoint's (`Checkpoint.expert_layout`), which decides the rows:

    * 'per_expert' (`experts.{e}.{gate,up,down}_proj`): [gate; up] rows (interleaved=False); w13's
      global scale is the gate's and `up_scale` [E] the up half's (NVFP4; None for MXFP4);
      input_scale (W4A4) per expert, w13's the max of gate's and up's (vLLM), w2's down's.
    * 'stacked_nvfp4' (ModelOpt's bmm experts) and 'gpt_oss_mxfp4' (`*_blocks` / `*_scales`), both
      read as gpt-oss's: the stacked gate_up rows kept interleaved (gate 2i, up 2i+1;
      interleaved=True); one global scale per expert over gate and up alike (NVFP4: the tensor's
      weight_scale_2, per expert or one for all; MXFP4: 1), so `up_scale` is None; input_scale
      (W4A4, NVFP4 only) the gate_up and down tensors' own.

    Biases [E, 2I] (in w13's row order) / [E, H] where the stacked layouts carry `*_bias` (gpt-oss;
    w2's zeros on tp_rank != 0, as a row-parallel bias is added once), else None."""
    w13: FP4Weight
    w2: FP4Weight
    experts: tuple[int, ...]
    num_global: int
    up_scale: Optional[Tensor] = None
    bias13: Optional[Tensor] = None
    bias2: Optional[Tensor] = None
    interleaved: bool = False
    layout: str = "per_expert"


def _stack(ws: Sequence[FP4Weight], fmt: str) -> FP4Weight:
    isc = None if any(w.input_scale is None for w in ws) else torch.stack([w.input_scale for w in ws])
    return FP4Weight(torch.stack([w.packed for w in ws]), torch.stack([w.scales for w in ws]),
                     torch.stack([w.global_scale.reshape(()) for w in ws]), fmt, isc)


def cat_rows(a: FP4Weight, b: FP4Weight) -> FP4Weight:
    isc = None if a.input_scale is None or b.input_scale is None else torch.maximum(a.input_scale, b.input_scale)
    return FP4Weight(torch.cat([a.packed, b.packed], -2), torch.cat([a.scales, b.scales], -2), a.global_scale,
                     a.fmt, isc)


def read_experts(ck: Checkpoint, block: str, experts: Optional[Sequence[int]] = None, *, tp_rank: int = 0,
                 tp_size: int = 1) -> ExpertWeights:
    """The block's routed experts `experts` (global ids, this rank's in local order; None: all),
    the intermediate dim split over tp_size (w13 rows / w2 columns, whole scale blocks)."""
    block = block.rstrip(".")
    lay = ck.expert_layout(block)
    total = ck.num_experts(block)
    ids = tuple(range(total)) if experts is None else tuple(int(e) for e in experts)
    if not ids or len(set(ids)) != len(ids) or not all(0 <= e < total for e in ids):
        raise CheckpointError(f"{ck.src}: {block}: experts {list(ids)[:8]} must be distinct ids in [0, {total})")
    if lay == "per_expert":
        return _read_per_expert(ck, block, ids, total, tp_rank, tp_size)
    # stacked tensors: gate_up interleaved rows (gpt-oss), split in whole MX blocks for MXFP4 (vLLM)
    gu = f"{block}.experts.gate_up_proj"
    dn = f"{block}.experts.down_proj"
    if lay == "gpt_oss_mxfp4":
        w13s, w2s, i0, i1 = _read_gpt_oss_mxfp4(ck, block, ids, tp_rank, tp_size)
        fmt = "mxfp4"
    else:
        w13s, w2s, i0, i1 = _read_modelopt_stacked(ck, block, ids, total, tp_rank, tp_size)
        fmt = "nvfp4"
    b13 = b2 = None
    if ck.has(gu + "_bias"):
        b13 = torch.stack([ck.read(gu + "_bias", (e, slice(2 * i0, 2 * i1))) for e in ids]).float()
    if ck.has(dn + "_bias"):
        b2 = torch.stack([ck.read(dn + "_bias", (e,)) for e in ids]).float()
        if tp_rank != 0:
            b2 = torch.zeros_like(b2)
    return ExpertWeights(_stack(w13s, fmt), _stack(w2s, fmt), ids, total, None, b13, b2, True, lay)


def _read_per_expert(ck: Checkpoint, block: str, ids: tuple[int, ...], total: int, tp_rank: int,
                     tp_size: int) -> ExpertWeights:
    """Per-expert modules (`experts.<e>.gate_proj` / `up_proj` / `down_proj`): w13 [gate; up] rows,
    gate and up column-parallel, down row-parallel in whole scale blocks; NVFP4's up global scale
    kept apart (`up_scale`)."""
    s = ck.scheme
    inter = ck.meta(ck._names(f"{block}.experts.0.gate_proj")["packed"]).shape[-2]
    shard_range(inter, tp_rank, tp_size, 1, f"{block}.experts (intermediate {inter})")
    blk = FORMATS[s.fmt].block
    if tp_size > 1 and inter % (tp_size * blk):
        shard_range(inter, tp_rank, tp_size, blk, f"{block}.experts.*.down_proj (row-parallel K, {s.fmt} block {blk})")
    col = (tp_rank, tp_size, "column" if tp_size > 1 else None)
    row = (tp_rank, tp_size, "row" if tp_size > 1 else None)
    g = [ck.linear(f"{block}.experts.{e}.gate_proj", tp_rank=col[0], tp_size=col[1], parallel=col[2]) for e in ids]
    u = [ck.linear(f"{block}.experts.{e}.up_proj", tp_rank=col[0], tp_size=col[1], parallel=col[2]) for e in ids]
    d = [ck.linear(f"{block}.experts.{e}.down_proj", tp_rank=row[0], tp_size=row[1], parallel=row[2]) for e in ids]
    w13 = _stack([cat_rows(a, b) for a, b in zip(g, u)], s.fmt)
    up = torch.stack([b.global_scale.reshape(()) for b in u]) if s.fmt == "nvfp4" else None
    return ExpertWeights(w13, _stack(d, s.fmt), ids, total, up, layout="per_expert")


def _read_gpt_oss_mxfp4(ck: Checkpoint, block: str, ids: tuple[int, ...], tp_rank: int,
                        tp_size: int) -> tuple[list[FP4Weight], list[FP4Weight], int, int]:
    """gpt-oss's MXFP4 `*_blocks` / `*_scales` stacks: per expert this rank's interleaved gate_up
    rows and down columns, the intermediate dim split in whole 32-element blocks (vLLM); also [i0, i1)."""
    gu = f"{block}.experts.gate_up_proj"
    dn = f"{block}.experts.down_proj"
    e_, n13, g13, _ = ck.meta(gu + "_blocks").shape
    inter = n13 // 2
    i0, i1 = gate_up_split(inter, tp_rank, tp_size, 32, f"{block}.experts (intermediate {inter})",
                           whole_blocks_cdiv=True)
    w13s, w2s = [], []
    for e in ids:
        pb = ck.read(gu + "_blocks", (e, slice(2 * i0, 2 * i1))).reshape(2 * (i1 - i0), g13 * 16)
        sc = ck.read(gu + "_scales", (e, slice(2 * i0, 2 * i1)))
        w13s.append(FP4Weight(pb.contiguous(), sc.contiguous(), torch.ones(()), "mxfp4"))
        h = ck.meta(dn + "_blocks").shape[1]
        pb = ck.read(dn + "_blocks", (e, slice(None), slice(i0 // 32, i1 // 32))).reshape(h, (i1 - i0) // 2)
        sc = ck.read(dn + "_scales", (e, slice(None), slice(i0 // 32, i1 // 32)))
        w2s.append(FP4Weight(pb.contiguous(), sc.contiguous(), torch.ones(()), "mxfp4"))
    return w13s, w2s, i0, i1


def _read_modelopt_stacked(ck: Checkpoint, block: str, ids: tuple[int, ...], total: int, tp_rank: int,
                           tp_size: int) -> tuple[list[FP4Weight], list[FP4Weight], int, int]:
    """ModelOpt's stacked NVFP4 (bmm experts): [E, K/2, N] / [E, K/16, N], blocks along K (dim -2),
    per expert this rank's gate_up and down slices transposed to [N, K/2], global and input scales
    one per tensor or per expert; also [i0, i1)."""
    gu = f"{block}.experts.gate_up_proj"
    dn = f"{block}.experts.down_proj"
    e_, k2, n13 = ck.meta(gu).shape
    inter = n13 // 2
    i0, i1 = shard_range(inter, tp_rank, tp_size, 1, f"{block}.experts (intermediate {inter})")
    if tp_size > 1:
        shard_range(inter, tp_rank, tp_size, 16, f"{block}.experts.down_proj (row-parallel K, nvfp4 block 16)")
    w13s, w2s = [], []
    g13 = ck._scalar_or_per_expert(gu + "_weight_scale_2", total)
    g2 = ck._scalar_or_per_expert(dn + "_weight_scale_2", total)
    is13 = ck._scalar_or_per_expert(gu + "_input_scale", total) if ck.has(gu + "_input_scale") else None
    is2 = ck._scalar_or_per_expert(dn + "_input_scale", total) if ck.has(dn + "_input_scale") else None
    for e in ids:
        pk = ck.read(gu, (e, slice(None), slice(2 * i0, 2 * i1))).T.contiguous()
        sc = ck.read(gu + "_weight_scale", (e, slice(None), slice(2 * i0, 2 * i1))).T.contiguous()
        w13s.append(FP4Weight(pk, sc, g13[e], "nvfp4", None if is13 is None else is13[e]))
        pk = ck.read(dn, (e, slice(i0 // 2, i1 // 2))).T.contiguous()
        sc = ck.read(dn + "_weight_scale", (e, slice(i0 // 16, i1 // 16))).T.contiguous()
        w2s.append(FP4Weight(pk, sc, g2[e], "nvfp4", None if is2 is None else is2[e]))
    return w13s, w2s, i0, i1


def gate_up_split(inter: int, tp_rank: int, tp_size: int, block: int, what: str,
                  whole_blocks_cdiv: bool = False) -> tuple[int, int]:
    """This rank's [i0, i1) of the expert intermediate dim. vLLM's gpt-oss MXFP4 loader shards it in
    whole 32-element blocks, cdiv(I/32, tp) per rank (the last shorter): `whole_blocks_cdiv`."""
    if not whole_blocks_cdiv:
        return shard_range(inter, tp_rank, tp_size, 1, what)
    if inter % block:
        raise CheckpointError(f"{what}: intermediate {inter} is not whole {block}-element blocks")
    if not (0 <= tp_rank < tp_size):
        raise CheckpointError(f"{what}: tp_rank {tp_rank} is not in [0, tp_size={tp_size})")
    per = math.ceil(inter // block / tp_size) * block
    i0, i1 = min(inter, tp_rank * per), min(inter, (tp_rank + 1) * per)
    if i0 >= i1:
        raise CheckpointError(f"{what}: rank {tp_rank} of {tp_size} gets no {block}-element block of {inter}")
    return i0, i1
