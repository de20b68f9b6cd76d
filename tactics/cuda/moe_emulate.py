"""The cuda grouped-MoE kernel's grid (moe_mma.cu) ported to the CPU, CTA by CTA: the tests' check of
its indexing and coverage against float64 (tests/families/cuda_moe_cpu.py runs it as a launcher)."""
from __future__ import annotations

import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from . import layout as L
from .moe import ALIGN_BLOCK_M, config, route


def emulate(problem: Problem, tactic: Tactic, x: torch.Tensor, w: L.CudaPacked, topk_ids: torch.Tensor,
            topk_weights: torch.Tensor | None = None, out: torch.Tensor | None = None,
            bad: torch.Tensor | None = None, trace: list | None = None, ws: torch.Tensor | None = None,
            red: torch.Tensor | None = None, shared_slot: bool = False) -> torch.Tensor:
    """The kernel's grid on the CPU, CTA by CTA, in the kernel's order of decisions: the invalid-id
    rows, the rank scan and the lead test, the gathered group (8·m_tiles pairs at most), the split
    ranges over K (warps inside a split summed in warp order, splits in split order), the SwiGLU
    pairing of gate/up tiles and the routing weight. Arithmetic: layout.emulate_dequantize_any (the
    kernel's decode, exact) and float32 sums — not the tensor core's accumulation order, so it
    checks indexing and coverage, not bits. `trace` collects (q, expert, pairs) of every lead CTA
    (q: the pair slot on the direct route, the group's CTA on the aligned one). Routes and token
    chunks as the launcher takes them (`route`; the aligned route's blocks from moe_align.reference). ws / red: the launcher's split-K workspace
    (≥ split_k·P·N fp32) and reduce rows (≥ P·N fp32) from its scratch pool, used as the kernel
    uses them (each split's partials stored, then summed in split order); None: local tensors.
    shared_slot: as the kernel's (ids and weights [M, top_k - 1], expert E - 1 added last).
    moe_tok tactics (`kernel="moe_tok"`) run moe_tok.cu's grid instead (`_emulate_token`). A walk
    (`n_walk` > 1) runs the same tiles, each with the same arithmetic, n_walk to a CTA in order: emulated
    tile by tile as without it."""
    cfg = config(problem, tactic)
    m = topk_ids.shape[0]
    if shared_slot:             # the kernel's pair_id / pair_weight: expert E - 1 last, a routed id >= E - 1 out of range
        e = problem.experts - 1
        topk_ids = torch.cat([topk_ids.masked_fill(topk_ids >= e, -2), topk_ids.new_full((m, 1), e)], 1)
        if topk_weights is not None:
            topk_weights = torch.cat([topk_weights, topk_weights.new_ones((m, 1))], 1)
    shape = (m, problem.n) if cfg.reduce else (m, problem.top_k, problem.out_n)
    out = torch.full(shape, float("nan"), dtype=torch.bfloat16) if out is None else out
    if cfg.token:
        _emulate_token(problem, cfg, x, w, topk_ids, topk_weights, out, bad, trace)
        return out
    kind, rows = route(problem, cfg, m, shared_slot)
    for t0 in range(0, m, rows):
        sl = slice(t0, min(m, t0 + rows))
        _emulate_launch(problem, cfg, x[sl], w, topk_ids[sl],
                        None if topk_weights is None else topk_weights[sl], out[sl], bad, trace, ws, red,
                        kind == "aligned")
    return out


def _groups(ids: list[int], experts: int, cap: int, aligned: bool) -> list[tuple[int, int, list[int]]]:
    """(q, expert, pairs) of every lead CTA in grid order, as the kernel forms them."""
    pairs = len(ids)
    if not aligned:                                      # a pair slot leads at rank 0 mod CAP
        out = []
        for q, eid in enumerate(ids):
            if 0 <= eid < experts and sum(1 for j in range(q) if ids[j] == eid) % cap == 0:
                out.append((q, eid, [j for j in range(q, pairs) if ids[j] == eid][:cap]))
        return out
    from autotune.tactics.triton_fp4.moe_align import reference
    srt, blocks, _ = reference(torch.tensor(ids), experts, ALIGN_BLOCK_M)
    sub = ALIGN_BLOCK_M // cap
    out = []
    for b, eid in enumerate(blocks):                     # blocks past the padded total: none here
        for i in range(sub):
            rows = [p for p in srt[b * ALIGN_BLOCK_M + i * cap:b * ALIGN_BLOCK_M + (i + 1) * cap] if p < pairs]
            if rows:                                     # a CTA of padding only exits
                out.append((b * sub + i, eid, rows))
    return out


def _emulate_launch(problem, cfg, x, w, topk_ids, tw, out, bad, trace, ws=None, red_buf=None,
                    aligned: bool = False) -> None:
    """One launch's grid over a token chunk: the invalid-id rows, then every lead CTA's N tiles
    (`_cta_tile`), then (REDUCE) the per-token sum of the pairs' fp32 rows."""
    ids = topk_ids.reshape(-1).tolist()
    pairs = len(ids)
    n, k = problem.n, problem.k
    cap = 8 * cfg.m_tiles
    n_tiles = n // (L.ROWS * cfg.tiles_n)                # grid.y
    out_tile = L.ROWS * (cfg.tiles_n // 2 if cfg.swiglu else cfg.tiles_n)
    # REDUCE: the pairs' fp32 rows, summed per token in slot order at the end (the kernel's last
    # arrival does the same sum; the arrival order does not change it)
    red = None
    if cfg.reduce:
        red = torch.empty((pairs, n)) if red_buf is None else red_buf[:pairs * n].view(pairs, n)
        red.fill_(float("nan"))
    part_ws = None if ws is None or cfg.split_k == 1 else ws[:cfg.split_k * pairs * n].view(cfg.split_k, pairs, n)
    yflat = red if cfg.reduce else out.reshape(pairs, problem.out_n)
    xflat = x.reshape(-1, k).float()
    _unrouted_rows(ids, problem.experts, yflat, n_tiles, out_tile, bad)
    deq: dict[int, torch.Tensor] = {}
    for q, eid, group in _groups(ids, problem.experts, cap, aligned):     # the lead CTAs
        if trace is not None:
            trace.append((q, eid, tuple(group)))
        if eid not in deq:
            deq[eid] = L.emulate_dequantize_any(L.expert(w, eid))
        xr = xflat[[p if x.dim() == 3 else p // problem.top_k for p in group]]
        for nt in range(n_tiles):
            total = _cta_tile(cfg, n, k, nt, xr, deq[eid], group, part_ws)
            if tw is not None:
                total = total * tw.reshape(-1)[group].float()[:, None]
            yflat[group, nt * out_tile:(nt + 1) * out_tile] = total if cfg.reduce else total.to(torch.bfloat16)
    if cfg.reduce:
        tot = torch.zeros(pairs // problem.top_k, n)
        for sl in range(problem.top_k):
            tot += red.reshape(-1, problem.top_k, n)[:, sl]
        out.copy_(tot.to(torch.bfloat16))


def _unrouted_rows(ids: list[int], experts: int, yflat: torch.Tensor, n_tiles: int, out_tile: int,
                   bad: torch.Tensor | None) -> None:
    """Rows of pairs routed nowhere (split 0, every N tile): zero for -1, NaN and `bad` set for an
    id outside [-1, E)."""
    for q, eid in enumerate(ids):
        if eid < 0 or eid >= experts:
            for nt in range(n_tiles):
                yflat[q, nt * out_tile:(nt + 1) * out_tile] = 0.0 if eid == -1 else float("nan")
            if eid != -1 and bad is not None:
                bad.fill_(1)


def _cta_tile(cfg, n: int, k: int, nt: int, xr: torch.Tensor, wd: torch.Tensor, group: list[int],
              part_ws: torch.Tensor | None) -> torch.Tensor:
    """One lead CTA's N tile `nt` for the pairs `group` (x rows `xr`, the expert's dequantized
    weight `wd`), fp32 [len(group), out tile]: warps inside a split summed in warp order, splits in
    split order (through the workspace `part_ws` where given), SwiGLU on gate/up tile pairs."""
    kps = k // L.KPAIR // cfg.split_k                    # k-pairs per split (grid.z)
    kpairs = kps // cfg.warps_k                          # per warp
    if cfg.swiglu:
        h = cfg.tiles_n // 2
        gate = [nt * h + u for u in range(h)]
        tiles = gate + [n // 32 + t for t in gate]
    else:
        tiles = [nt * cfg.tiles_n + u for u in range(cfg.tiles_n)]
    rows_w = torch.cat([torch.arange(t * L.ROWS, (t + 1) * L.ROWS) for t in tiles])
    total = torch.zeros(len(group), len(rows_w))
    gidx = torch.tensor(group)
    for kz in range(cfg.split_k):                        # split order
        part = torch.zeros(len(group), len(rows_w))
        for wp in range(cfg.warps_k):                    # warp order
            k0 = (kz * kps + wp * kpairs) * L.KPAIR
            part += xr[:, k0:k0 + kpairs * L.KPAIR] @ wd[rows_w, k0:k0 + kpairs * L.KPAIR].T
        if part_ws is not None:                          # stored to the workspace, summed by the last split
            part_ws[kz][gidx[:, None], rows_w[None, :]] = part
        else:
            total += part
    if part_ws is not None:
        for kz in range(cfg.split_k):
            total += part_ws[kz][gidx[:, None], rows_w[None, :]]
    if cfg.swiglu:
        half = total.shape[1] // 2
        total = total[:, :half] * torch.sigmoid(total[:, :half]) * total[:, half:]
    return total


def _emulate_token(problem, cfg, x, w, topk_ids, tw, out, bad, trace) -> None:
    """moe_tok.cu's grid, CTA (token, N tile) by CTA: the token's slots with an expert in slot order,
    each warp's K range of a slot times the slot's scale (here the routing weight: the decode folds
    the global scale in) summed into the warp's row in slot order, then the warps in warp order; a
    token with an id outside [-1, E) a NaN row and `bad` set; no slot with an expert, a zero row.
    `trace` collects (token, slots' experts) per token that reads weights."""
    n, k, top_k = problem.n, problem.k, problem.top_k
    kpairs = k // L.KPAIR // cfg.warps_k                   # per warp and slot
    xs = x.reshape(-1, k).float()                          # per pair (reduce: x [M, top_k, K])
    deq: dict[int, torch.Tensor] = {}
    for tok, row in enumerate(topk_ids.tolist()):
        if any(e < -1 or e >= problem.experts for e in row):
            out[tok] = float("nan")
            if bad is not None:
                bad.fill_(1)
            continue
        slots = [(s, e) for s, e in enumerate(row) if e >= 0]
        if trace is not None and slots:
            trace.append((tok, tuple(e for _, e in slots)))
        total = torch.zeros(n)
        for wp in range(cfg.warps_k):                      # warp order
            k0, k1 = wp * kpairs * L.KPAIR, (wp + 1) * kpairs * L.KPAIR
            acc = torch.zeros(n)
            for s, e in slots:                             # slot order, every N tile at once
                if e not in deq:
                    deq[e] = L.emulate_dequantize_any(L.expert(w, e))
                xr = xs[tok * top_k + s] if x.dim() == 3 else xs[tok]
                part = deq[e][:, k0:k1] @ xr[k0:k1]
                acc += part * (float(tw[tok, s]) if tw is not None else 1.0)
            total += acc
        out[tok] = total.to(torch.bfloat16)
