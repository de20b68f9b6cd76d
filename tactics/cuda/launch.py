"""Launching the cuda family's kernel from PyTorch tensors through CuPy (imported here only).

Pointers go in as integers, on PyTorch's current stream (so CUDA-graph capture records it); the
global scale is read on the device (no host sync). Each M variant is compiled and checked
(resources, see build.load) the first time that M tile is used on a device. Split-K tactics cut a
large M into row chunks (dense.chunk_rows), each launched with the whole split.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.base import LauncherBase

from . import build as B
from . import dense as D
from . import layout as L
from .dense import check_call  # noqa: F401  (re-exported: the launcher's argument check)


class Launch(LauncherBase):
    """run(x, packed, out): the kernel on PyTorch's current stream, no host sync. Split-K tactics
    take their fp32 workspace through `workspace(nbytes, device, stream)` (a buffer per stream owned
    here by default; a shared scratch pool can replace the method) and own their tile counters,
    zeroed once and left zero by every launch; `workspace_bytes(m)` says what a call needs. The
    compiled functions stay cached in it; `release()` frees the scratch."""

    capture_safe = True

    def __init__(self, problem: Problem, tactic: Tactic, device: str, config: Callable[..., B.Config]):
        import cupy
        self._cupy = cupy
        self.problem, self.tactic, self.config = problem, tactic, config
        self.device = torch.device(device)
        self.split_k = D.split_k(tactic)
        self.rows = D.chunk_rows(problem, tactic)          # rows per launch (split-K), None: any M
        self._streams: dict[int, Any] = {}
        self._fns: dict[tuple[int, int], tuple[int, Any]] = {}
        self._ws: dict[int, torch.Tensor] = {}           # stream -> fp32 workspace
        self._locks: dict[int, torch.Tensor] = {}        # stream -> int32 counters (zero between launches)
        self._retired: list[torch.Tensor] = []           # outgrown: a graph captured earlier still points at them

    def _stream(self, dev: torch.device) -> Any:
        ptr = torch.cuda.current_stream(dev).cuda_stream
        s = self._streams.get(ptr)
        if s is None:
            s = self._streams[ptr] = self._cupy.cuda.ExternalStream(ptr, dev.index or 0)  # Stream.from_external needs CuPy 14
        return s

    def function(self, m_tiles: int, dev: torch.device) -> tuple[int, Any]:
        """(M tile, function): the wanted tile, or the largest smaller one when the wanted variant
        is refused for spilling (e.g. 64 rows at one warp on sm_90): grid.y then covers M."""
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        key = (m_tiles, idx)
        hit = self._fns.get(key)
        if hit is not None:
            return hit
        major, minor = torch.cuda.get_device_capability(idx)
        err: Exception | None = None
        for mt in [t for t in B.M_TILES if t <= m_tiles][::-1]:
            try:
                hit = self._fns[key] = (mt, B.load(self.config(self.tactic, mt, self.problem), f"sm_{major}{minor}", idx))
                return hit
            except B.SpillError as e:
                err = err or e
        raise err if err else RuntimeError("no M tile")

    # ---- split-K scratch ------------------------------------------------------------------------
    def workspace_bytes(self, m: int) -> int:
        """Bytes of fp32 workspace a call with m rows needs (0 without split-K): [split, rows, N]
        with rows = min(m, the row chunk)."""
        return 4 * D.workspace_elems(self.problem, self.tactic, m)

    def workspace(self, nbytes: int, device: torch.device, stream: int) -> torch.Tensor:
        """At least `nbytes` of fp32 workspace for launches on `stream` (the one method a shared
        scratch pool replaces): this launcher's own buffer per stream, grown at least by doubling;
        an outgrown one is kept (a captured graph may still point at it)."""
        need = -(-nbytes // 4)
        b = self._ws.get(stream)
        if b is None or b.numel() < need or b.device != device:
            if b is not None:
                self._retired.append(b)
                need = max(need, 2 * b.numel()) if b.device == device else need
            b = self._ws[stream] = torch.empty(need, dtype=torch.float32, device=device)
        return b

    def _counters(self, n: int, device: torch.device, stream: int) -> torch.Tensor:
        b = self._locks.get(stream)
        if b is None or b.numel() < n or b.device != device:
            if b is not None:
                self._retired.append(b)
                n = max(n, 2 * b.numel()) if b.device == device else n
            b = self._locks[stream] = torch.zeros(n, dtype=torch.int32, device=device)
        return b

    def release(self) -> None:
        """Free the workspace, counters and outgrown buffers (a later call makes them again); a
        graph captured before must not be replayed after this."""
        self._ws.clear()
        self._locks.clear()
        self._retired.clear()

    def __call__(self, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor | None) -> torch.Tensor:
        m, out = check_call(self.problem, x, w, out)
        if m == 0:
            return out
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous().clone() if x.data_ptr() % 16 else x.contiguous()
        rows = self.rows or m
        for r0 in range(0, m, rows):                # split-K: row chunks, each with the whole split
            self._launch(x[r0:r0 + rows], w, out[r0:r0 + rows])
        return out

    def _launch(self, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor) -> None:
        p, m = self.problem, x.shape[0]
        mt, fn = self.function(B.m_tiles_for(m), x.device)
        c = self.config(self.tactic, mt, p)
        grid = (p.n // (L.ROWS * c.tiles_n), -(-m // (8 * mt)), c.split_k)
        ws_ptr = lock_ptr = 0
        stream = self._stream(x.device)
        if c.split_k > 1:
            ws_ptr = self.workspace(4 * c.split_k * m * p.n, x.device, stream.ptr).data_ptr()
            lock_ptr = self._counters(grid[0] * grid[1], x.device, stream.ptr).data_ptr()
        args = (np.uint64(w.packed.data_ptr()), np.uint64(w.scales.data_ptr()), np.uint64(x.data_ptr()),
                np.uint64(out.data_ptr()), np.uint64(w.global_scale.data_ptr()),
                np.int32(m), np.int32(p.n), np.int32(p.k), np.uint64(ws_ptr), np.uint64(lock_ptr))
        with stream:
            fn(grid, (c.threads, 1, 1), args)
