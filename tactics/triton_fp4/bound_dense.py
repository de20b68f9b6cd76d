"""Bound launchers of the dense members (w4a16_dequant, dequant_cublas): one weight, everything
that does not change between calls computed at bind (a call pays only what varies).

At bind: the weight's pointers (ints), N, K, the constexprs and the cheap x check. Per M, on the
first call with that M (and stream, for kernels that own scratch): the grid, the split, the
scratch, and the compiled kernel with its launch handles (direct.py) — a `plan`, kept in a dict
keyed by M. A call then does the x check, one dict lookup, the output allocation (none with
`out=`), the current stream and one launch through Triton's compiled launcher.

Scratch (split-K workspace and tile counters; dequant_cublas's bf16 weight buffer) comes from a
ScratchPool (tactics/scratch.py): the launcher's own, or the dispatcher's after `attach` (shared
by every layer it binds), one set per CUDA stream, so launches on two streams never share it. A
buffer that a larger M outgrows is kept alive (a CUDA graph captured earlier may still point at
it); a plan holds the pool's `epoch` and is made again when the pool freed buffers since.

Where the direct route is not available (interpreter, CPU, other Triton versions, a launch hook,
$AUTOTUNE_LAUNCH=triton, an x or out that is not 16-byte aligned and contiguous) the call goes
through the member's normal launcher (Triton's own launch), with the same bound weight.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from autotune.core.operands import out_checker, x_checker
from autotune.core.problem import Problem
from autotune.tactics.base import LauncherBase
from autotune.tactics.scratch import ScratchPool

from . import direct
from .splitk import chunk_rows

#: plans kept per launcher (distinct M values); past this, a new M is planned on every call
MAX_PLANS = 4096


def _capturing() -> bool:
    import torch
    return torch.cuda.is_current_stream_capturing()


def _aligned(*ts) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


class _Plan(NamedTuple):
    """BoundW4A16's launch at one M: what the call hands Triton's compiled launcher."""

    stream: int             # the stream its scratch belongs to; -1: no scratch, any stream
    epoch: int              # the pool's epoch it was made at
    run: Any                # Triton's compiled launcher (direct.Direct.run)
    tiles: int              # grid x
    split: int              # grid y (split-K)
    function: Any
    metadata: Any
    w_ptrs: tuple           # the weight's pointers
    scratch_ptrs: tuple     # workspace, counters
    tail: tuple             # N, K and the constexprs


class _DequantPlan(NamedTuple):
    """BoundDequantCublas's dequant launch on one stream, and the bf16 weight it fills."""

    run: Any
    grid_n: int
    grid_k: int
    function: Any
    metadata: Any
    args: tuple             # weight pointers, the buffer's, N, K and the constexprs
    w_t: Any                # the buffer, transposed: torch.matmul's right operand
    epoch: int


class _BoundDense(LauncherBase):
    """Shared part: weight, checks, plan cache, the fallback. Subclasses implement `_plan(x, out,
    stream)` -> a plan tuple, or None when this call must take the normal launch."""

    def __init__(self, problem: Problem, launcher: Any, packed: Any, batch_invariant: bool = False):
        self.problem, self.inner, self.weight = problem, launcher, packed
        self.caps = replace(launcher.caps, batch_invariant=batch_invariant)
        self.n, self.k = problem.n, problem.k
        self.device = packed.packed.device
        self.check, self.check_out = x_checker(problem, packed), out_checker(problem)
        self.scratch = self._own = ScratchPool()
        self.plans: dict[int, tuple] = {}
        why = "not a CUDA weight" if self.device.type != "cuda" else direct.why_not()
        if why is None and not _aligned(packed.packed, packed.scales, packed.global_scale):
            why = "weight tensors not 16-byte aligned"
        self.direct, self.why = why is None, why
        self.w_ptrs = (packed.packed.data_ptr(), packed.scales.data_ptr(), packed.global_scale.data_ptr())
        self._stream = direct.stream_getter() if self.direct else None
        self.launches = [0, 0]          # [direct, normal]: which route answered (tests, bench)
        self.source = packed            # the weight object this was bound from (Remember)

    @property
    def smem_compiled(self):
        return self.inner.smem_compiled

    def release(self) -> None:
        """Its own scratch and the plans that point into scratch (a later call plans again), and
        the inner launcher's (a dispatcher's pool is the dispatcher's)."""
        self._own.clear()
        self.plans.clear()
        self.inner.release()

    def attach(self, scratch=None, bad_word=None) -> None:
        """Take workspaces from the dispatcher's pool (plans made before point elsewhere: dropped)."""
        if scratch is not None and scratch is not self.scratch:
            self.scratch = scratch
            self.plans.clear()
            self.inner.attach(scratch)      # its normal launch (the fallback) too

    def _fallback(self, x, out):
        self.launches[1] += 1
        return self.inner.launch(x, self.weight, out=out)

    def _give_up(self, e: Exception, x, out):
        self.direct, self.why = False, f"planning failed: {type(e).__name__}: {e}"
        return self._fallback(x, out)

    def _out(self, x, out):
        if out is None:
            return x.new_empty((x.shape[0], self.n))
        self.check_out(x, out)
        return out


class Remember(LauncherBase):
    """Mixin for the unbound launchers (`dispatch((M, N, K))(x, w)`): a weight object seen on two
    calls in a row is bound (`bound_cls`), and its later calls take the bound launcher's route."""

    bound_cls: Any = None
    _seen: Any = None
    _bound: Any = None

    def __call__(self, x, w, out=None):
        b = self._bound
        if b is not None and b.source is w:
            return b(x, out)
        if self._seen is w and getattr(w, "packed", None) is not None and w.packed.is_cuda \
                and not _capturing():                 # bind (and plan) outside any graph capture
            from .args import U8Weight, pack_u8
            self._bound = b = self.bound_cls(self.problem, self, w if isinstance(w, U8Weight) else pack_u8(w))
            b.source = w
            b.attach(self._pool)
            return b(x, out)
        self._seen = w
        return self.launch(x, w, out=out)

    _pool: Any = None

    def attach(self, scratch=None, bad_word=None) -> None:
        """The bound form a remembered weight gets takes its scratch from `scratch`."""
        if scratch is not None:
            self._pool = scratch
            if self._bound is not None:
                self._bound.attach(scratch)

    def release(self) -> None:
        """The bound form made for a remembered weight (and its scratch); subclasses add their own."""
        if self._bound is not None:
            self._bound._own.clear()
            self._bound.plans.clear()
        self._bound = self._seen = None


class BoundW4A16(_BoundDense):
    """launch(x, out=None) for the fused W4A16 kernel (split-K scratch per stream)."""

    def __call__(self, x, out=None):
        self.check(x)
        m = x.shape[0]
        if out is None:
            out = x.new_empty((m, self.n))
        else:
            self.check_out(x, out)
        xp, op = x.data_ptr(), out.data_ptr()
        if not self.direct or not m or xp & 15 or op & 15 or not x.is_contiguous() or not out.is_contiguous():
            return self._fallback(x, out)
        stream = self._stream(self.device.index)
        p = self.plans.get(m)
        if p is None or (p.stream != stream and p.stream != -1) or p.epoch != self.scratch.epoch:   # -1: any stream
            try:
                p = self._plan(x, out, stream)
            except Exception as e:  # noqa: BLE001 - a route that cannot plan falls back, once
                return self._give_up(e, x, out)
            if p is None:           # split-K cut into row chunks (large M): the launcher's loop
                return self._fallback(x, out)
        self.launches[0] += 1
        _, _, run, tiles, split, function, metadata, w_ptrs, scratch_ptrs, tail = p     # a _Plan: one unpack
        run(tiles, split, 1, stream, function, metadata, None, None, None, xp, *w_ptrs, op, *scratch_ptrs, m, *tail)
        return out

    def _plan(self, x, out, stream):
        import torch
        import triton

        from .kernel import w4a16_dequant_kernel as fn
        inner, prm = self.inner, self.inner.params
        m, n, k = x.shape[0], self.n, self.k
        bm, bn, sk = prm["block_m"], prm["block_n"], prm["split_k"]
        rows = chunk_rows(prm, n)
        if rows is not None and m > rows:       # not planned: more than one launch (splitk.chunk_rows)
            return None
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        need = sk * tiles * bm * bn if sk > 1 else 4
        pool = self.scratch
        if sk > 1:
            ws = pool.get(stream, "splitk.ws", need, torch.float32, x.device)
            locks = pool.get(stream, "splitk.locks", max(4, tiles), torch.int32, x.device, zero=True)
        else:                   # the kernel touches neither: placeholders that never grow a real buffer
            ws, locks = pool.get(stream, "unused.f32", 4, torch.float32, x.device), \
                pool.get(stream, "unused.i32", 4, torch.int32, x.device)
        w = self.weight
        consts = {**inner._consts, "SPLIT_K": sk}
        kw = {"num_warps": prm["num_warps"], "num_stages": prm["num_stages"], **consts}
        grid = (tiles, sk)
        ck = direct.compiled(fn, grid, (x, w.packed, w.scales, w.global_scale, out, ws, locks, m, n, k), kw)
        from .args import note_compiled
        from .smem import smem_bytes
        note_compiled(inner, ck, x.device, lambda arch: smem_bytes(prm, self.problem.w_fmt, arch))
        d = direct.Direct(ck)
        tail = direct.constexprs(fn, 10, consts)
        p = _Plan(stream if sk > 1 else -1, pool.epoch, d.run, tiles, sk, d.function, d.metadata, self.w_ptrs,
                  (ws.data_ptr(), locks.data_ptr()), (n, k, *tail))
        # counters allocated under capture are zeroed only by the graph: plan again outside it
        if (len(self.plans) < MAX_PLANS or m in self.plans) and not pool.dirty:
            self.plans[m] = p
        return p


class BoundDequantCublas(_BoundDense):
    """launch(x, out=None): dequantize W into this launcher's bf16 buffer (one per stream), then
    torch.matmul into out. The dequant launch does not depend on M: one plan per stream."""

    def __call__(self, x, out=None):
        import torch
        self.check(x)
        out = self._out(x, out)
        if not self.direct or not x.shape[0]:
            return self._fallback(x, out)
        stream = self._stream(self.device.index)
        p = self.plans.get(stream)
        if p is None or p.epoch != self.scratch.epoch:
            try:
                p = self._plan(stream)
            except Exception as e:  # noqa: BLE001
                return self._give_up(e, x, out)
        self.launches[0] += 1
        run, grid_n, grid_k, function, metadata, args, w_t, _ = p        # a _DequantPlan: one unpack
        run(grid_n, grid_k, 1, stream, function, metadata, None, None, None, *args)
        torch.matmul(x, w_t, out=out)
        return out

    def _plan(self, stream):
        import torch
        import triton

        from .kernel import dequant_bf16_kernel as fn
        inner, prm, n, k = self.inner, self.inner.params, self.n, self.k
        wbuf = self.scratch.get(stream, "dequant.wbuf", n * k, torch.bfloat16, self.device).view(-1)[:n * k].view(n, k)
        grid = (triton.cdiv(n, prm["block_n"]), k // prm["block_k"])
        w = self.weight
        kw = {"num_warps": prm["num_warps"], **inner._consts}
        ck = direct.compiled(fn, grid, (w.packed, w.scales, w.global_scale, wbuf, n, k), kw)
        d = direct.Direct(ck)
        tail = direct.constexprs(fn, 6, inner._consts)
        p = _DequantPlan(d.run, grid[0], grid[1], d.function, d.metadata, (*self.w_ptrs, wbuf.data_ptr(), n, k, *tail),
                         wbuf.T, self.scratch.epoch)
        self.plans[stream] = p
        return p
