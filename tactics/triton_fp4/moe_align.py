"""Routing alignment for grouped MoE on the device: one launch when M·top_k ≤ CHUNK, two above.

Input: topk_ids [M, top_k] (int32 or int64; -1 = expert not on this rank). Output (`Alignment`):

* `sorted_ids` int32 [max_blocks · BLOCK_M]: the (token, slot) pair ids p = token · top_k + slot,
  grouped by expert in expert order, stable (pairs of one expert keep their order), each expert's
  run padded to a multiple of BLOCK_M with the sentinel P = M · top_k;
* `expert_ids` int32 [max_blocks]: the expert of each BLOCK_M row block, -1 past the padded total;
* `npad` int32 [1]: the padded total (a multiple of BLOCK_M);
* `bad` int32 [1]: a sticky flag, set to 1 by any id outside [-1, E).

max_blocks = ⌈P / BLOCK_M⌉ + min(E, P) bounds the padded total (each expert that is hit wastes
< BLOCK_M rows), so every buffer has a size known on the host: no host sync, CUDA-graph safe.
Pairs with id -1 contribute nothing (no row, no padding). Ids ≥ E (or < -1) are dropped the same
way and set `bad`: a caller may check it with one 4-byte read when not capturing
(`Alignment.raise_if_bad()`, a host sync), or after a graph replay; nothing on the serving path
reads it (the decode kernel flags the same ids in its own word: docs/fp4moe.md#bad-expert-ids). Deterministic:
no atomics; every position is written by exactly one program.

Kernels. Pairs are cut into chunks of CHUNK. `_moe_count_kernel` (one program per chunk) writes
each chunk's per-expert histogram. `_moe_scatter_kernel` (one program per chunk) sums the
histograms (all chunks for the totals, chunks before its own for its base), takes the padded
prefix over experts, places its pairs at start[e] + earlier-chunk count + rank within the chunk
(an exclusive cumsum of the [CHUNK, E] match matrix), and fills its share of the block → expert
map and the padding. With one chunk the scatter kernel counts for itself (ONE_PASS): one launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

#: pairs per program; the [CHUNK, E_PAD] match matrix lives in registers (8 warps)
MAX_CHUNK = 64
NUM_WARPS = 8
#: the scatter kernel's histogram rows summed per step and row blocks filled per step
HIST_ROWS, BLOCK_ROWS = 8, 16


@triton.jit
def _match(ids_ptr, c, P, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """Chunk c's pair ids, their expert ids and the [CHUNK, E_PAD] one-hot match matrix."""
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
    ex = tl.arange(0, E_PAD)
    hit = (ids[:, None] == ex[None, :]) & (ex[None, :] < NUM_EXPERTS)
    return offs, ids, hit


@triton.jit
def _flag_bad(ids, bad_ptr, NUM_EXPERTS: tl.constexpr):
    nbad = tl.sum(((ids < -1) | (ids >= NUM_EXPERTS)).to(tl.int32), axis=0)
    if nbad > 0:
        tl.store(bad_ptr, 1)


@triton.jit(do_not_specialize=["P"])
def _moe_count_kernel(ids_ptr, hist_ptr, bad_ptr, P, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr,
                      CHUNK: tl.constexpr):
    c = tl.program_id(0)
    _, ids, hit = _match(ids_ptr, c, P, NUM_EXPERTS, E_PAD, CHUNK)
    tl.store(hist_ptr + c * E_PAD + tl.arange(0, E_PAD), tl.sum(hit.to(tl.int32), axis=0))
    _flag_bad(ids, bad_ptr, NUM_EXPERTS)


@triton.jit(do_not_specialize=["P", "n_chunks", "max_blocks"])
def _moe_scatter_kernel(ids_ptr, hist_ptr, sorted_ptr, expert_ptr, npad_ptr, bad_ptr, P, n_chunks, max_blocks,
                        NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_M: tl.constexpr, ONE_PASS: tl.constexpr, HIST_ROWS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr):
    c = tl.program_id(0)
    ex = tl.arange(0, E_PAD)
    offs, ids, hit = _match(ids_ptr, c, P, NUM_EXPERTS, E_PAD, CHUNK)
    hiti = hit.to(tl.int32)
    if ONE_PASS:
        total = tl.sum(hiti, axis=0)
        before = tl.zeros([E_PAD], dtype=tl.int32)
        _flag_bad(ids, bad_ptr, NUM_EXPERTS)       # the count kernel flags them otherwise
    else:
        total = tl.zeros([E_PAD], dtype=tl.int32)
        before = tl.zeros([E_PAD], dtype=tl.int32)
        for c0 in range(0, n_chunks, HIST_ROWS):
            cc = c0 + tl.arange(0, HIST_ROWS)
            h = tl.load(hist_ptr + cc[:, None] * E_PAD + ex[None, :], mask=cc[:, None] < n_chunks, other=0)
            total += tl.sum(h, axis=0)
            before += tl.sum(tl.where(cc[:, None] < c, h, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    npad = tl.sum(padded, axis=0)
    # the pair's place: its expert's start + pairs of that expert in earlier chunks + rank in this one
    rank = tl.cumsum(hiti, axis=0) - 1
    dest = tl.sum(tl.where(hit, (starts + before)[None, :] + rank, 0), axis=1)
    placed = tl.sum(hiti, axis=1) > 0
    tl.store(sorted_ptr + dest, offs.to(tl.int32), mask=placed)
    if c == 0:
        tl.store(npad_ptr, npad)
    # this program's share of the row blocks: expert id, and the sentinel in padding rows
    fill_end = starts + total
    per = tl.cdiv(max_blocks, n_chunks)
    for b0 in range(c * per, min(max_blocks, c * per + per), BLOCK_ROWS):
        b = b0 + tl.arange(0, BLOCK_ROWS)
        inb = b < min(max_blocks, c * per + per)
        row0 = b * BLOCK_M
        e_of = tl.sum((ends[None, :] <= row0[:, None]).to(tl.int32), axis=1)
        used = row0 < npad
        tl.store(expert_ptr + b, tl.where(used, e_of, -1), mask=inb)
        end_b = tl.sum(tl.where(ex[None, :] == e_of[:, None], fill_end[None, :], 0), axis=1)
        pos = row0[:, None] + tl.arange(0, BLOCK_M)[None, :]
        pad = (inb & used)[:, None] & (pos >= end_b[:, None])
        tl.store(sorted_ptr + pos, tl.full(pos.shape, 0, tl.int32) + P, mask=pad)


@dataclass
class Alignment:
    """What `align` returns (device tensors, plus the host-known sizes the kernels need)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    npad: torch.Tensor
    bad: torch.Tensor
    pairs: int                  # P = M · top_k
    block_m: int
    max_blocks: int
    launches: int               # 1 (one chunk) or 2

    def regroup(self, block_m: int) -> "Alignment":
        """This alignment for a smaller BLOCK_M that divides ours (one alignment serves a layer's
        w13 and w2 when their tiles differ): the same sorted ids (runs padded to our BLOCK_M are
        padded to theirs too), each block split in r, and a sub-block holding only padding gets
        expert -1 (no work). Two small device ops, no host sync."""
        import torch
        if block_m == self.block_m:
            return self
        if block_m <= 0 or self.block_m % block_m:
            raise ValueError(f"an alignment for BLOCK_M={self.block_m} cannot serve BLOCK_M={block_m}")
        r = self.block_m // block_m
        n = self.max_blocks * r
        first = self.sorted_ids[: n * block_m].view(n, block_m)[:, 0]
        experts = torch.where(first < self.pairs, self.expert_ids.repeat_interleave(r), -1)
        return Alignment(self.sorted_ids, experts, self.npad, self.bad, self.pairs, block_m, n, self.launches)

    def raise_if_bad(self) -> None:
        """One 4-byte read (a host sync): skipped while a CUDA graph is being captured."""
        raise_if_bad(self.bad, "topk_ids")


def raise_if_bad(bad, what: str) -> None:
    import torch
    if bad.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if int(bad.item()):
        bad.zero_()
        raise ValueError(f"{what} holds expert ids outside [-1, E) (ids >= E or < -1 are refused)")


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    return -(-pairs // block_m) + min(experts, pairs)


def chunk_for(pairs: int) -> int:
    return max(16, min(MAX_CHUNK, triton.next_power_of_2(max(1, pairs))))


class Aligner:
    """align(topk_ids) → Alignment for a fixed (E, BLOCK_M). Keeps its buffers per pair count, so
    a captured graph keeps pointing at live memory (one launch at a time per aligner). The sticky
    `bad` word is shared by every alignment of this aligner."""

    def __init__(self, experts: int, block_m: int):
        if experts <= 0 or block_m not in (16, 32, 64, 128):
            raise ValueError(f"need experts > 0 and BLOCK_M in 16/32/64/128, got E={experts}, BLOCK_M={block_m}")
        self.experts, self.block_m = experts, block_m
        self.e_pad = triton.next_power_of_2(experts)
        self._bufs: dict = {}
        self._bad = None

    def _buffers(self, pairs: int, device):
        import torch
        key = (pairs, str(device))
        if key not in self._bufs:
            chunk = chunk_for(pairs)
            n_chunks = triton.cdiv(pairs, chunk)
            mb = max_blocks(pairs, self.experts, self.block_m)
            if self._bad is None or self._bad.device != torch.device(device):
                self._bad = torch.zeros(1, dtype=torch.int32, device=device)
            self._bufs[key] = (chunk, n_chunks, mb,
                               torch.empty(mb * self.block_m, dtype=torch.int32, device=device),
                               torch.empty(mb, dtype=torch.int32, device=device),
                               torch.empty(1, dtype=torch.int32, device=device),
                               torch.empty(max(1, n_chunks) * self.e_pad, dtype=torch.int32, device=device))
        return self._bufs[key]

    def __call__(self, topk_ids) -> Alignment:
        import torch
        if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids must be a 2-D int32/int64 tensor, got {tuple(topk_ids.shape)} {topk_ids.dtype}")
        ids = topk_ids.contiguous()
        pairs = ids.numel()
        chunk, n_chunks, mb, sorted_ids, expert_ids, npad, hist = self._buffers(max(pairs, 1), ids.device)
        if pairs == 0:
            npad.zero_()
            expert_ids.fill_(-1)
            return Alignment(sorted_ids, expert_ids, npad, self._bad, 0, self.block_m, mb, 0)
        consts = dict(NUM_EXPERTS=self.experts, E_PAD=self.e_pad, CHUNK=chunk)
        one = n_chunks == 1
        if not one:
            _moe_count_kernel[(n_chunks,)](ids, hist, self._bad, pairs, num_warps=NUM_WARPS, **consts)
        _moe_scatter_kernel[(n_chunks,)](ids, hist, sorted_ids, expert_ids, npad, self._bad, pairs, n_chunks, mb,
                                         BLOCK_M=self.block_m, ONE_PASS=int(one), HIST_ROWS=HIST_ROWS,
                                         BLOCK_ROWS=BLOCK_ROWS,
                                         num_warps=NUM_WARPS, **consts)
        return Alignment(sorted_ids, expert_ids, npad, self._bad, pairs, self.block_m, mb, 1 if one else 2)


def reference(topk_ids, experts: int, block_m: int) -> tuple[list[int], list[int], int]:
    """Plain-Python alignment (the tests' reference): (sorted_ids up to npad, expert per used
    block, npad). Ids outside [0, E) contribute nothing."""
    flat = [int(v) for v in topk_ids.reshape(-1).tolist()]
    p = len(flat)
    out, blocks = [], []
    for e in range(experts):
        run = [i for i, v in enumerate(flat) if v == e]
        if not run:
            continue
        padded = -(-len(run) // block_m) * block_m
        out += run + [p] * (padded - len(run))
        blocks += [e] * (padded // block_m)
    return out, blocks, len(out)
