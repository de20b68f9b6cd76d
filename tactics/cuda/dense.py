"""The dense kernel's (w4a16_mma.cu) tiling rules, its split-K, SwiGLU and MXFP4 forms, and its grid
ported to the CPU (`emulate`). Its member of the cuda family (`DenseMember`) lives beside its
launcher in launch.py, which imports these rules (this module imports no launcher).

* **Split-K** (`split_k` ∈ SPLIT_K, a tactic parameter present only when > 1, so the 32 tactics
  without it keep their ids): grid.z CTAs split K into equal contiguous ranges; each stores its fp32
  partial rows to a workspace [split, M, N], fences and bumps a counter per (M tile, N tile); the
  last to arrive sums the partials in split order, runs the epilogue and resets the counter (one
  launch, no memset, graph-capturable: moe_mma's scheme). A call with more rows than
  `chunk_rows` is cut into row chunks, each launched with the tactic's whole split (the split is
  never lowered), so the workspace stays under MAX_WORKSPACE_BYTES.
* **SwiGLU** (the dense problem's `swiglu` epilogue, vLLM's [gate; up] rows, y [M, N/2]): a CTA's
  `tiles_n` row tiles are tiles_n/2 gate tiles and the matching up tiles N/2 rows further on, so
  `tiles_n` must be even; the epilogue writes silu(gate)·up from the fp32 sums.
* **MXFP4** (E8M0 scales per 32 k): the grouped kernel's scale words (layout.FORMAT: lanes t and
  t^1 share one word, `SW` = 16), a 2-D weight packed as one stacked expert (layout.pack).
* **Scratch** (`DenseScratch`): the workspace and counters come from a ScratchPool, the launcher's
  own or the dispatcher's after `attach` (named "splitk.ws" / "splitk.locks", as the grouped
  kernel's: launches on one stream follow each other, and each leaves the counters zero), so 78
  layers hold one layer's largest workspace, not 78.
* **Batch invariance**: a row's K order is fixed by the tactic (warps in warp order, splits in split
  order, whatever the M tile, the row chunk or the arrival order), and an MMA column (a row of x)
  never mixes with another, so every dense tactic is declared batch-invariant.
"""
from __future__ import annotations

from typing import Any

import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.base import LauncherBase
from autotune.tactics.scratch import PoolUser, stream_key

from . import build as B
from . import layout as L

WARPS_K = (1, 2, 4, 8)
STAGES = (2, 3, 4, 6)
TILES_N = (1, 2)
SCHEMA = {"warps_k": WARPS_K, "stages": STAGES, "tiles_n": TILES_N}
SPLIT_K = (2, 4, 8)
SPLIT_SCHEMA = {**SCHEMA, "split_k": SPLIT_K}        # split-K tactics carry split_k; split 1 has none
STATIC_SMEM_LIMIT = 48 * 1024          # a static __shared__ array can not opt in beyond 48 KiB
#: the split-K part of the space (warps, ring depth, row tiles): what a split-K decode launch needs
SPLIT_WARPS_K = (2, 4, 8)
SPLIT_STAGES = (2, 4)
#: a split-K launch never takes a workspace larger than this: larger M is cut into row chunks
MAX_WORKSPACE_BYTES = 32 << 20
#: rows of x per M tile of the largest variant (a chunk is whole tiles of it)
ROWS_PER_TILE = 64


def split_k(tactic: Tactic) -> int:
    return int(tactic.params.get("split_k", 1))


def new_form(problem: Problem, tactic: Tactic) -> bool:
    """A form of the dense kernel added by issue #26 (split-K, SwiGLU, MXFP4 scales), as opposed to
    the NVFP4 kernel whose 32 tactics ran on the H200 (docs/cuda-family.md section 5)."""
    return split_k(tactic) > 1 or problem.epilogue == "swiglu" or problem.w_fmt != "nvfp4"


def check_tiling(problem: Problem, tactic: Tactic) -> str | None:
    """The tactic's tiles divide the problem: the kernel assumes it (`kpairs = K / 128 / split / WK`
    drops a K tail; the grid's N / (16 * tiles_n) CTAs leave a row tail unwritten), so the verdict,
    build and bind all refuse a problem that breaks it."""
    wk, sk, tn = int(tactic["warps_k"]), split_k(tactic), int(tactic["tiles_n"])
    if problem.k % (L.KPAIR * wk * sk):
        what = "warps_k*split_k" if sk > 1 else "warps_k"
        return f"K={problem.k} is not a multiple of {L.KPAIR}*{what}={L.KPAIR * wk * sk}"
    if problem.n % (L.ROWS * tn):
        return f"N={problem.n} is not a multiple of {L.ROWS}*tiles_n={L.ROWS * tn}"
    if problem.epilogue == "swiglu" and tn % 2:
        return "the swiglu epilogue pairs gate and up tiles: tiles_n must be even"
    return None


def chunk_rows(problem: Problem, tactic: Tactic) -> int | None:
    """Rows of x per launch of a split-K tactic (None: one launch takes any M). Whole 64-row tiles,
    as many as keep the workspace [split, rows, N] fp32 under MAX_WORKSPACE_BYTES (at least one)."""
    sk = split_k(tactic)
    if sk == 1:
        return None
    per_tile = sk * ROWS_PER_TILE * problem.n * 4
    return ROWS_PER_TILE * max(1, MAX_WORKSPACE_BYTES // per_tile)


def workspace_elems(problem: Problem, tactic: Tactic, m: int) -> int:
    """fp32 elements of split-K workspace a call with m rows needs (0 without split-K)."""
    rows = chunk_rows(problem, tactic)
    return 0 if rows is None else split_k(tactic) * min(m, rows) * problem.n


class DenseScratch(PoolUser):
    """The dense launcher's split-K scratch (the GPU launcher and the CPU port share it): fp32
    workspace and int32 counters (zeroed once, left zero by every launch) per stream from a
    ScratchPool, its own until `attach` gives the dispatcher's (tactics/scratch.py: grown at least
    by doubling, outgrown buffers kept for captured graphs). `release()` frees its own pool only."""

    problem: Problem
    tactic: Tactic

    def workspace_bytes(self, m: int) -> int:
        """Bytes of fp32 workspace a call with m rows needs (0 without split-K): [split, rows, N]
        with rows = min(m, the row chunk)."""
        return 4 * workspace_elems(self.problem, self.tactic, m)

    def workspace(self, nbytes: int, device: Any, stream: int | None = None) -> torch.Tensor:
        s = stream_key(device) if stream is None else stream
        return self.scratch.get(s, "splitk.ws", -(-nbytes // 4), torch.float32, device)

    def counters(self, n: int, device: Any, stream: int | None = None) -> torch.Tensor:
        s = stream_key(device) if stream is None else stream
        return self.scratch.get(s, "splitk.locks", n, torch.int32, device, zero=True)

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        super().attach(scratch)                 # a dense launch reads no ids: no bad-id word

    def bad_word(self) -> Any:
        return None

    def release(self) -> None:
        """Free its own scratch (a dispatcher's pool is the dispatcher's): a graph captured before
        must not be replayed after this."""
        self._own.clear()


def tiles_of(problem: Problem, tiles_n: int, nt: int) -> list[int]:
    """The weight row tiles CTA column nt reads, in the kernel's order (SwiGLU: gate tiles, then
    the matching up tiles N/32 tiles further on)."""
    if problem.epilogue == "swiglu":
        h = tiles_n // 2
        gate = [nt * h + u for u in range(h)]
        return gate + [problem.n // 32 + t for t in gate]
    return [nt * tiles_n + u for u in range(tiles_n)]


def check_call(problem: Problem, x, w, out, cuda: bool = True):
    """One-line ValueErrors for anything the kernel would misread; returns (M, out) with out [M,
    N] (SwiGLU: N/2) made when not given. cuda=False (the CPU port) skips the device-type check."""
    p = problem
    if not torch.is_tensor(x) or (cuda and x.device.type != "cuda") or w.packed.device != x.device:
        raise ValueError(f"{p.key}: cuda family needs x and the weight on one CUDA device, got "
                         f"{getattr(x, 'device', type(x).__name__)} and {w.packed.device}")
    if x.dtype != torch.bfloat16 or x.ndim != 2 or x.shape[1] != p.k:
        raise ValueError(f"{p.key}: x must be bf16 [M, {p.k}], got {x.dtype} {tuple(x.shape)}")
    if (w.n, w.k) != (p.n, p.k):
        raise ValueError(f"{p.key}: packed weight is {w.n}x{w.k}, the problem {p.n}x{p.k}")
    m = x.shape[0]
    if out is None:
        out = torch.empty(m, p.out_n, dtype=torch.bfloat16, device=x.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (m, p.out_n) or not out.is_contiguous() \
            or out.device != x.device:
        raise ValueError(f"{p.key}: out must be contiguous bf16 [{m}, {p.out_n}] on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)}")
    return m, out


# --------------------------------------------------------------------------- CPU port of the grid
def emulate(problem: Problem, tactic: Tactic, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor | None = None,
            m_tiles: int | None = None, locks: torch.Tensor | None = None, trace: list | None = None,
            ws: torch.Tensor | None = None) -> torch.Tensor:
    """The dense kernel's grid on the CPU, CTA by CTA, in the kernel's order of decisions: the row
    chunks the launcher cuts, grid (N tiles, M tiles, split), each CTA's weight tiles (SwiGLU's
    gate/up pairing), its K range (split, then warps, summed in warp order), the partials in a
    workspace [split, rows, N] and the counter per (M tile, N tile) whose last arrival sums them in
    split order, runs the epilogue and resets it. Arithmetic: layout.emulate_dequantize_any (the
    kernel's decode of either format, exact) and float32 sums, not the tensor core's order: it checks indexing and
    coverage, not bits. `trace` collects (chunk row 0, nt, mt, kz, tiles) of every CTA; `locks`
    (int32, zero) is the counters' buffer, left zero as the kernel leaves it; `ws` (fp32, at least
    [split, rows, N] elements) the workspace, overwritten (NaN first: the kernel's is garbage)."""
    from .build import m_tiles_for
    n, k, tn, wk, sk = problem.n, problem.k, int(tactic["tiles_n"]), int(tactic["warps_k"]), split_k(tactic)
    m = x.shape[0]
    out = torch.full((m, problem.out_n), float("nan"), dtype=torch.bfloat16) if out is None else out
    wd = L.emulate_dequantize_any(w)                               # fp32 [N, K], alpha applied
    xf = x.float()
    rows = chunk_rows(problem, tactic) or max(m, 1)
    kps = k // L.KPAIR // sk                                       # k-pairs per split
    kpw = kps // wk                                                # per warp
    for r0 in range(0, m, rows):
        xs, ys = xf[r0:r0 + rows], out[r0:r0 + rows]
        mc = xs.shape[0]
        mt = m_tiles if m_tiles is not None else m_tiles_for(mc)
        grid = (n // (L.ROWS * tn), -(-mc // (8 * mt)), sk)
        if ws is None:
            part_ws = torch.full((sk, mc, n), float("nan"))
        else:
            part_ws = ws[:sk * mc * n].view(sk, mc, n)
            part_ws.fill_(float("nan"))
        cnt = locks if locks is not None else torch.zeros(grid[0] * grid[1], dtype=torch.int32)
        for kz in reversed(range(sk)):                             # arrival order must not matter
            for my in range(grid[1]):
                for nt in range(grid[0]):
                    tiles = tiles_of(problem, tn, nt)
                    if trace is not None:
                        trace.append((r0, nt, my, kz, tuple(tiles)))
                    wrows = torch.cat([torch.arange(t * L.ROWS, (t + 1) * L.ROWS) for t in tiles])
                    mrows = torch.arange(my * 8 * mt, min(mc, (my + 1) * 8 * mt))
                    part = torch.zeros(len(mrows), len(wrows))
                    for wp in range(wk):                           # warp order
                        k0 = (kz * kps + wp * kpw) * L.KPAIR
                        part += xs[mrows, k0:k0 + kpw * L.KPAIR] @ wd[wrows, k0:k0 + kpw * L.KPAIR].T
                    if sk > 1:
                        part_ws[kz][mrows[:, None], wrows[None, :]] = part
                        slot = my * grid[0] + nt
                        cnt[slot] += 1
                        if int(cnt[slot]) != sk:
                            continue
                        part = torch.zeros(len(mrows), len(wrows))
                        for s in range(sk):                        # split order
                            part += part_ws[s][mrows[:, None], wrows[None, :]]
                        cnt[slot] = 0
                    _epilogue(problem, tn, nt, part, ys, mrows)
    return out


def _epilogue(problem: Problem, tn: int, nt: int, acc: torch.Tensor, y: torch.Tensor, mrows: torch.Tensor) -> None:
    """One CTA's output columns: the fp32 sums (alpha is in the dequantized weight), SwiGLU's
    silu(gate)·up of its paired tiles, bf16."""
    if problem.epilogue == "swiglu":
        h = acc.shape[1] // 2
        acc = acc[:, :h] * torch.sigmoid(acc[:, :h]) * acc[:, h:]
    out_tn = tn // 2 if problem.epilogue == "swiglu" else tn
    c0 = nt * out_tn * L.ROWS
    y[mrows, c0:c0 + out_tn * L.ROWS] = acc.to(torch.bfloat16)


def emulate_runner(problem: Problem, tactic: Tactic) -> Any:
    """`run(x, packed, out=None)` on the CPU: `emulate` behind the launcher's own argument checks,
    its workspace and counters from its DenseScratch (a test family's runner)."""
    return _CpuRun(problem, tactic)


class _CpuRun(DenseScratch, LauncherBase):

    def __init__(self, problem: Problem, tactic: Tactic):
        self.problem, self.tactic = problem, tactic
        self._init_pool()

    def __call__(self, x, w, out=None):
        m, out = check_call(self.problem, x, w, out, cuda=False)
        if not m:
            return out
        if split_k(self.tactic) == 1:
            return emulate(self.problem, self.tactic, x, w, out)
        rows = min(m, chunk_rows(self.problem, self.tactic) or m)
        tiles = self.problem.n // (L.ROWS * int(self.tactic["tiles_n"])) * -(-rows // 8)   # most (N, M) tiles
        return emulate(self.problem, self.tactic, x, w, out, locks=self.counters(tiles, x.device),
                       ws=self.workspace(self.workspace_bytes(m), x.device))


def config(tactic: Tactic, m_tiles: int, problem: Problem | None = None) -> B.Config:
    """The compiled variant of a dense tactic at an M tile (problem: its epilogue, SwiGLU or none)."""
    return B.Config(m_tiles, int(tactic["warps_k"]), int(tactic["stages"]), int(tactic["tiles_n"]),
                    split_k(tactic), problem is not None and problem.epilogue == "swiglu",
                    problem.w_fmt if problem is not None else "nvfp4")
