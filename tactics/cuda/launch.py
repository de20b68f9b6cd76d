"""Launching the cuda family's kernel from PyTorch tensors through CuPy (imported here only).

Pointers go in as integers, on PyTorch's current stream (so CUDA-graph capture records it), through
pdl.runner (programmatic dependent launch on sm_90+, else CuPy's launch); the
global scale is read on the device (no host sync). Each M variant is compiled and checked
(resources, see build.load) the first time that M tile is used on a device. Split-K tactics cut a
large M into row chunks (dense.chunk_rows), each launched with the whole split. `DenseMember`, the
dense kernel as a member of the cuda family (schema, space, verdict, this launcher), is here too.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import Caps, LauncherBase
from autotune.tactics.scratch import stream_key

from . import args as A
from . import build as B
from . import dense as D
from . import layout as L
from . import pdl as P
from .dense import check_call  # noqa: F401  (re-exported: the launcher's argument check)


#: plans kept per launcher (one per M seen; decode serves a few Ms): beyond it, made per call
MAX_PLANS = 256


class Launch(D.DenseScratch, LauncherBase):
    """run(x, packed, out): the kernel on PyTorch's current stream, no host sync. Split-K tactics
    take their fp32 workspace and tile counters (zeroed once, left zero by every launch) from a
    ScratchPool, their own until `attach` gives the dispatcher's (dense.DenseScratch);
    `workspace_bytes(m)` says what a call needs. The compiled functions stay cached in it;
    `release()` frees its own scratch."""

    caps = Caps(capture_safe=True)

    def __init__(self, problem: Problem, tactic: Tactic, device: str, config: Callable[..., B.Config]):
        self.problem, self.tactic, self.config = problem, tactic, config
        self.device = torch.device(device)
        self.split_k = D.split_k(tactic)
        self.rows = D.chunk_rows(problem, tactic)          # rows per launch (split-K), None: any M
        self._fns: dict[tuple[int, int], tuple[int, Any]] = {}
        self._plans: dict[tuple[int, Any], tuple] = {}   # (M, device index) -> run, grid, block, workspace bytes, int32s
        self._init_pool()

    def _run(self, fn: Any, c: B.Config, dev: torch.device) -> P.Run:
        """How `fn` launches on `dev` (pdl.runner: with programmatic dependent launch on sm_90+)."""
        return P.runner(fn, B.text(c), B.kernel_name(c), dev.index or 0)

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

    def __call__(self, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor | None = None) -> torch.Tensor:
        m, out = check_call(self.problem, x, w, out)
        if m == 0:
            return out
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous().clone() if x.data_ptr() % 16 else x.contiguous()
        rows = self.rows
        if rows is None or m <= rows:               # one launch: no views made
            self._launch(x, w, out)
            return out
        for r0 in range(0, m, rows):                # split-K: row chunks, each with the whole split
            self._launch(x[r0:r0 + rows], w, out[r0:r0 + rows])
        return out

    def _launch(self, x: torch.Tensor, w: L.CudaPacked, out: torch.Tensor) -> None:
        p, m, dev = self.problem, x.shape[0], x.device
        plan = self._plans.get((m, dev.index))
        if plan is None:                # what depends on M only: the variant, grid, the int32 arguments
            mt, fn = self.function(B.m_tiles_for(m), dev)
            c = self.config(self.tactic, mt, p)
            grid = (p.n // (L.ROWS * c.tiles_n), -(-m // (8 * mt)), c.split_k)
            plan = (self._run(fn, c, dev), grid, (c.threads, 1, 1), 4 * c.split_k * m * p.n,
                    {"M": np.int32(m), "N": np.int32(p.n), "K": np.int32(p.k)})
            if len(self._plans) < MAX_PLANS:
                self._plans[(m, dev.index)] = plan
        run, grid, block, ws_bytes, ints = plan
        ws_ptr = lock_ptr = 0
        stream = stream_key(dev)
        if grid[2] > 1:
            ws_ptr, lock_ptr = self._pointers((m, dev, stream), stream, lambda: (
                self.workspace(ws_bytes, dev, stream).data_ptr(), self.counters(grid[0] * grid[1], dev, stream).data_ptr()))
        # pointers as Python ints (8 bytes in CuPy's launch), the int32s made once per M (moe.py says why)
        args = A.W4A16_MMA.pack(wq=w.packed.data_ptr(), sq=w.scales.data_ptr(), x=x.data_ptr(), y=out.data_ptr(),
                                gscale=w.global_scale.data_ptr(), ws=ws_ptr, locks=lock_ptr, **ints)
        run(grid, block, args, stream)


class DenseMember:
    """The dense kernel (w4a16_mma.cu) as a member of the cuda family (members.py): tactics name no
    kernel; parameters `warps_k`, `stages`, `tiles_n` and, on split-K tactics only, `split_k`; every M
    tile (B.M_TILES) is its own compiled variant, the largest the verdict's worst case."""

    grouped = False

    def __init__(self, member: Any):
        self.member = member

    def validate(self, tactic: Tactic) -> str | None:
        return check_params(tactic, D.SPLIT_SCHEMA if "split_k" in tactic.params else D.SCHEMA, "cuda")

    def space(self, problem: Problem, arch: Arch) -> list[Tactic]:
        tiles = (2,) if problem.epilogue == "swiglu" else D.TILES_N      # SwiGLU pairs a gate and an up tile
        plain = [Tactic("cuda", warps_k=w, stages=s, tiles_n=n) for w in D.WARPS_K for s in D.STAGES for n in tiles]
        split = [Tactic("cuda", warps_k=w, stages=s, tiles_n=n, split_k=k) for k in D.SPLIT_K
                 for w in D.SPLIT_WARPS_K for s in D.SPLIT_STAGES for n in tiles]
        return plain + split

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        return Tactic("cuda", warps_k=4 if problem.k % (L.KPAIR * 4) == 0 else 1, stages=4,
                      tiles_n=2 if problem.epilogue == "swiglu" else 1)

    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        if arch.cc_int < 80:
            return Verdict.reject(f"mma.sync bf16 and cp.async need sm_80 or newer, not {arch.name}")
        why = D.check_tiling(problem, tactic)
        if why:
            return Verdict.reject(why)
        # the largest M tile is the worst case; every variant's figure is exact (the source's array)
        smem = max(B.smem_bytes(c) for c in self.configs(problem, tactic))
        limit = min(D.STATIC_SMEM_LIMIT, arch.smem_per_block_optin)
        if smem > limit:
            return Verdict.reject(f"static shared memory {smem} B > {limit} B", smem, limit, int(tactic["stages"]))
        return Verdict.keep(smem, limit, int(tactic["stages"]))

    def configs(self, problem: Problem, tactic: Tactic) -> list[B.Config]:
        """Every compiled variant a call may launch (one per M tile)."""
        return [D.config(tactic, t, problem) for t in B.M_TILES]

    def runner(self, problem: Problem, tactic: Tactic, device: str) -> Any:
        """`run(x, packed, out=None)`: CuPy is imported here, after every check of build and bind."""
        return Launch(problem, tactic, device, D.config)

    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        return {}
