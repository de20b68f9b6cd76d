"""Launching the cuda family's kernel from PyTorch tensors through CuPy (imported here only).

Pointers go in as integers, on PyTorch's current stream (so CUDA-graph capture records it); the
global scale is read on the device (no host sync). Each M variant is compiled and checked
(resources, see build.load) the first time that M tile is used on a device.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.base import LauncherBase

from . import build as B
from . import layout as L


class Launch(LauncherBase):
    """run(x, packed, out): the kernel on PyTorch's current stream, no host sync; it owns no
    scratch (the compiled functions stay cached in it)."""

    capture_safe = True

    def __init__(self, problem: Problem, tactic: Tactic, device: str, config: Callable[[Tactic, int], B.Config]):
        import cupy
        self._cupy = cupy
        self.problem, self.tactic, self.config = problem, tactic, config
        self.device = torch.device(device)
        self._streams: dict[int, Any] = {}
        self._fns: dict[tuple[int, int], tuple[int, Any]] = {}

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
                hit = self._fns[key] = (mt, B.load(self.config(self.tactic, mt), f"sm_{major}{minor}", idx))
                return hit
            except B.SpillError as e:
                err = err or e
        raise err if err else RuntimeError("no M tile")

    def __call__(self, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor | None) -> torch.Tensor:
        p = self.problem
        if x.device.type != "cuda" or w.packed.device != x.device:
            raise ValueError(f"{p.key}: cuda family needs x and the weight on one CUDA device, got "
                             f"{x.device} and {w.packed.device}")
        if x.dtype != torch.bfloat16 or x.ndim != 2 or x.shape[1] != p.k:
            raise ValueError(f"{p.key}: x must be bf16 [M, {p.k}], got {x.dtype} {tuple(x.shape)}")
        if (w.n, w.k) != (p.n, p.k):
            raise ValueError(f"{p.key}: packed weight is {w.n}x{w.k}, the problem {p.n}x{p.k}")
        m = x.shape[0]
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous().clone() if x.data_ptr() % 16 else x.contiguous()
        if out is None:
            out = torch.empty(m, p.n, dtype=torch.bfloat16, device=x.device)
        elif out.dtype != torch.bfloat16 or tuple(out.shape) != (m, p.n) or not out.is_contiguous():
            raise ValueError(f"{p.key}: out must be contiguous bf16 [{m}, {p.n}], got {out.dtype} {tuple(out.shape)}")
        if m == 0:
            return out
        mt, fn = self.function(B.m_tiles_for(m), x.device)
        c = self.config(self.tactic, mt)
        grid = (p.n // (L.ROWS * c.tiles_n), -(-m // (8 * mt)), 1)
        args = (np.uint64(w.packed.data_ptr()), np.uint64(w.scales.data_ptr()), np.uint64(x.data_ptr()),
                np.uint64(out.data_ptr()), np.uint64(w.global_scale.data_ptr()),
                np.int32(m), np.int32(p.n), np.int32(p.k))
        with self._stream(x.device):
            fn(grid, (c.threads, 1, 1), args)
        return out
