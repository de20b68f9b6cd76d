"""What the cuda family's `build` and `bind` return around a grouped runner (MoeLaunch, TokLaunch, or a
test family's): `MoeKernel` passes a call's options through where the runner has them (a shared slot,
a routing alignment, a prefetch, a scratch output), and `raise_if_bad` is the opt-in host read of the
bad-id word. Launch code: the GPU-check record digests it (checked.py)."""
from __future__ import annotations

from autotune.tactics.scratch import capturing


class MoeKernel:
    """`kernel(x, w, topk_ids, topk_weights=None, out=None, aligned=None)`: what `build` returns
    (and `bind` wraps): a runner (MoeLaunch, or a test family's) on the packed weight, a plain
    FP4Weight packed once per weight object when `cache` is given. `aligned=`: a routing alignment a
    caller shares between a layer's kernels (asked for by `aligned_block_m`), passed to the runner."""

    batch_invariant = True        # the family declares it for every moe_mma tactic
    pdl = False

    def __init__(self, run, cache=None):
        self.launcher, self._cache = run, cache
        self.capture_safe = bool(getattr(run, "capture_safe", False))
        self.checks_ids = bool(getattr(run, "checks_ids", False))
        self.shared_slot = bool(getattr(run, "shared_slot", False))
        self.prefetches = bool(getattr(run, "prefetches", False))
        self.scratch_out = bool(getattr(run, "scratch_out", False))

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, aligned=None, shared_slot=False, prefetch=None,
                 scratch_out=False):
        kw = {"shared_slot": True} if shared_slot else {}
        if shared_slot and not self.shared_slot:
            raise ValueError("this moe_mma runner takes no shared slot")
        if aligned is not None:
            kw["aligned"] = aligned
        if prefetch is not None:
            if not self.prefetches:
                raise ValueError("this moe_mma runner takes no prefetch")
            kw["prefetch"] = prefetch
        if scratch_out:
            if not self.scratch_out:
                raise ValueError("this moe_mma runner writes no scratch output")
            kw["scratch_out"] = True
        return self.launcher(x, self._cache(w) if self._cache is not None else w, topk_ids, topk_weights, out, **kw)

    def aligned_block_m(self, m: int) -> int | None:
        fn = getattr(self.launcher, "aligned_block_m", None)
        return fn(m) if fn is not None else None

    def aligner(self, experts: int, block_m: int):
        fn = getattr(self.launcher, "aligner", None)
        if fn is None:
            raise NotImplementedError("this moe_mma runner takes no shared routing alignment")
        return fn(experts, block_m)

    def attach(self, scratch=None, bad_word=None) -> None:
        """The runner takes the dispatcher's pool and word (tactics/base.py Launcher.attach)."""
        fn = getattr(self.launcher, "attach", None)
        if fn is not None:
            fn(scratch, bad_word)

    def bad_word(self):
        return getattr(self.launcher, "bad", None)

    def release(self) -> None:
        """Free the launcher's scratch and the pack cache (a later call makes them again)."""
        getattr(self.launcher, "release", lambda: None)()
        if self._cache is not None and hasattr(self._cache, "_items"):
            self._cache._items.clear()


def raise_if_bad(bad) -> None:
    """One 4-byte read (a host sync), skipped while a CUDA graph is captured; clears the word."""
    if bad is None or capturing(bad.device):
        return
    if int(bad.item()):
        bad.zero_()
        raise ValueError("topk_ids holds expert ids outside [-1, E) (ids >= E or < -1 are refused)")
