"""Member `w4a16_dequant`: the fused dense W4A16 kernel of kernel.py (dequantize in registers,
tl.dot), with BLOCK_M/N/K, GROUP_M, SPLIT_K (decode: small row tiles, K split over many
programs), num_warps and num_stages."""
from __future__ import annotations

import itertools
from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from .bound_dense import BoundW4A16, Remember
from .splitk import chunk_rows
from .args import is_interpreting, note_compiled, out_tensor, weight_args
from .compile import ast_source
from .member import (FAMILY, SHARED_CODE, MIN_BLOCK_K, POW2_K, POW2_MN, STAGES_OK,
                     WARPS_OK, check_axes, grid, scale_consts, w4a16_rules, w4a16_support)
from .smem import smem_bytes, tmem_columns, unchecked

KERNEL = "w4a16_dequant"
BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (64, 128, 256)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)
GROUP_M = (1, 8)
#: the default space's main grid (the order of enumeration); `TritonFamily.space_axes` replaces axes
GRID = {"block_m": BLOCK_M, "block_n": BLOCK_N, "block_k": BLOCK_K, "num_warps": NUM_WARPS,
        "num_stages": NUM_STAGES, "group_m": GROUP_M}
#: split-K sub-space (decode): small row tiles, many K splits, so a few rows still fill the GPU
SPLIT_K = (2, 4, 8, 16)
SPLIT_BLOCK_M = (16, 32)
SPLIT_BLOCK_N = (32, 64, 128)
SPLIT_BLOCK_K = (128, 256)
SPLIT_STAGES = (3, 4)
SPLITS_OK = (1, 2, 4, 8, 16, 32)


def silly(bm: int, bn: int, bk: int, warps: int) -> bool:
    """Combinations pruned from the space by rule (never by compiling)."""
    if warps == 8 and bm * bn < 64 * 128:        # 8 warps on a small tile: idle warps
        return True
    if warps == 4 and bm * bn >= 128 * 256:      # 128x256 fp32 accumulator on 128 threads: spills
        return True
    if bn * bk > 256 * 128:                      # dequantized tile of > 32K elements in registers
        return True
    return False


def tactic(bm: int, bn: int, bk: int, gm: int, warps: int, stages: int, split_k: int = 1) -> Tactic:
    return Tactic(FAMILY, kernel=KERNEL, block_m=bm, block_n=bn, block_k=bk, group_m=gm,
                  num_warps=warps, num_stages=stages, split_k=split_k)


def default_block_k(problem: Problem) -> int:
    """The default's BLOCK_K: 128 where it tiles K, then 64, then 256 (never under the format's minimum)."""
    return next((b for b in (128, 64, 256) if problem.k % b == 0 and b >= MIN_BLOCK_K[problem.w_fmt]), 128)


def kernel_consts(fmt: str, params: Mapping[str, Any], interp: bool = False) -> dict[str, int]:
    """The kernel's constexprs for `params`: what the launcher passes and compile.py compiles."""
    return {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]),
            "BLOCK_K": int(params["block_k"]), "GROUP_M": int(params["group_m"]),
            "SPLIT_K": int(params["split_k"]), **scale_consts(fmt),
            "DEQ_ASM": 0 if interp else 1, "DOT_F32": 1 if interp else 0}


class W4A16Member:
    kernel = KERNEL
    #: this member's sources, keyed into its trials and winners (autotune.core.codekey)
    code = Code.of(f"triton/{KERNEL}", __package__, *SHARED_CODE, ".w4a16",
                   ".kernel", ".bound_dense", ".splitk", ".smem", ".direct")
    compat_kernel = KERNEL
    schema = {"kernel": (KERNEL,), "block_m": POW2_MN, "block_n": POW2_MN, "block_k": POW2_K,
              "group_m": tuple(range(1, 65)), "num_warps": WARPS_OK, "num_stages": STAGES_OK,
              "split_k": SPLITS_OK}

    def supports(self, problem: Problem) -> str | None:
        return w4a16_support(problem, KERNEL, "dense")

    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> list[Tactic]:
        mink = MIN_BLOCK_K[problem.w_fmt]
        out = [Tactic(FAMILY, kernel=KERNEL, split_k=1, **g) for g in grid(GRID, axes)
               if g["block_k"] >= mink and not silly(g["block_m"], g["block_n"], g["block_k"], g["num_warps"])]
        out += [tactic(bm, bn, bk, 1, 4, stages, sk)
                for bm, bn, bk, stages, sk in itertools.product(SPLIT_BLOCK_M, SPLIT_BLOCK_N, SPLIT_BLOCK_K,
                                                                SPLIT_STAGES, SPLIT_K)
                if bk >= mink and not silly(bm, bn, bk, 4)]
        return out

    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        check_axes(KERNEL, GRID, self.schema, axes)

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        return tactic(64, 64, default_block_k(problem), 8, 4, 3)

    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        return w4a16_rules(problem, params, arch, pipelined=True)

    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """Each row's K loop runs in the same order at every M: in one program without split-K;
        with it, in the tactic's fixed split summed in split order (chunk_rows: large M is cut
        into launches, never given a smaller split)."""
        return True

    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return smem_bytes(params, fmt, arch)

    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return tmem_columns(params, fmt, arch)

    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> str | None:
        return unchecked(params, fmt, arch)

    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list[tuple[Any, dict]]:
        from .kernel import ARG_NAMES, ARG_TYPES, DIVISIBLE, w4a16_dequant_kernel     # imports Triton
        src = ast_source(w4a16_dequant_kernel, ARG_NAMES, ARG_TYPES, DIVISIBLE, kernel_consts(fmt, params))
        return [(src, {"num_warps": int(params["num_warps"]), "num_stages": int(params["num_stages"])})]

    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> "W4A16Launcher":
        return W4A16Launcher(problem, tactic.params)


MEMBER = W4A16Member()


class W4A16Launcher(Remember):
    """kernel(x, w, out=None) -> y. `w` is an FP4Weight or the family's U8Weight pack.

    After the first call, `smem_compiled` holds the compiled kernel's `metadata.shared` (None
    under TRITON_INTERPRET=1, where nothing is compiled) and `smem_model` the static model's value
    for the device's arch. With split_k > 1 the launcher owns an fp32 workspace and a zeroed
    int32 counter per output tile (the kernel leaves them zero): one launch at a time per launcher.
    Large M is cut into row chunks (chunk_rows) so the workspace stays under MAX_WORKSPACE_BYTES.
    """

    bound_cls = BoundW4A16

    def __init__(self, problem: Problem, params: Mapping[str, Any]):
        self.problem = problem
        self.params = dict(params)
        self.smem_compiled: int | None = None
        self.smem_model: int | None = None
        self.compiled = None
        self._ws = None
        self._locks = None
        self._retired: list = []   # outgrown workspaces: a CUDA graph captured earlier still points at them
        # resolved once per launcher, not per call: dispatch calls this on every GEMM
        self._consts = kernel_consts(problem.w_fmt, self.params, is_interpreting())

    def release(self) -> None:
        """The split-K workspace, its counters and the outgrown ones."""
        super().release()
        self._ws = self._locks = None
        self._retired.clear()

    def _scratch(self, sk: int, tiles: int, device):
        """Workspace [sk, tiles, BM·BN] fp32 and `tiles` zeroed counters (grown on demand, at least
        doubling, so the retired buffers stay under the live one's size; without split-K the kernel
        touches neither and they stay at 4 elements). Attached to a dispatcher's pool
        (tactics/scratch.py): that pool's buffers for the current stream instead."""
        import torch
        need = sk * tiles * self.params["block_m"] * self.params["block_n"] if sk > 1 else 4
        nlocks = max(4, tiles) if sk > 1 else 4
        if self._pool is not None:
            from autotune.tactics.scratch import stream_key
            s, names = stream_key(device), ("splitk.ws", "splitk.locks") if sk > 1 else ("unused.f32", "unused.i32")
            return (self._pool.get(s, names[0], need, torch.float32, device),
                    self._pool.get(s, names[1], nlocks, torch.int32, device, zero=sk > 1))
        if self._ws is None or self._ws.numel() < need or self._locks.numel() < nlocks or self._ws.device != device:
            if self._ws is not None:
                self._retired.append((self._ws, self._locks))
                if self._ws.device == device:
                    need, nlocks = max(need, 2 * self._ws.numel()), max(nlocks, 2 * self._locks.numel())
            self._locks = torch.zeros(nlocks, dtype=torch.int32, device=device)
            self._ws = torch.empty(need, dtype=torch.float32, device=device)
        return self._ws, self._locks

    def launch(self, x, w, out=None):
        """Triton's own launch (the route every call took before #17; bound launchers fall back to it)."""
        import triton

        from .kernel import w4a16_dequant_kernel

        prob, p = self.problem, self.params
        m, n, k, packed, scales, gs = weight_args(prob, x, w)
        x = x.contiguous()
        out = out_tensor(out, (m, n), x)
        if m == 0:
            return out
        bm, bn, sk = p["block_m"], p["block_n"], p["split_k"]
        rows = chunk_rows(p, n) or m
        for r0 in range(0, m, rows):          # one launch unless split-K's workspace would pass the cap
            mc = min(rows, m - r0)
            xc, oc = (x, out) if mc == m else (x[r0:r0 + mc], out[r0:r0 + mc])
            tiles = triton.cdiv(mc, bm) * triton.cdiv(n, bn)
            ws, locks = self._scratch(sk, tiles, x.device)
            ck = w4a16_dequant_kernel[(tiles, sk)](xc, packed, scales, gs, oc, ws, locks, mc, n, k,
                                                   num_warps=p["num_warps"], num_stages=p["num_stages"],
                                                   **{**self._consts, "SPLIT_K": sk})
        note_compiled(self, ck, x.device, lambda arch: smem_bytes(p, prob.w_fmt, arch))
        return out


__all__ = ["KERNEL", "MEMBER", "W4A16Launcher", "W4A16Member"]
