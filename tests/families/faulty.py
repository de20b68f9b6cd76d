"""A test-only family whose members misbehave on purpose: wrong values, unwritten outputs, an
exception. The search must record each as failed with its reason and never pick it."""
from __future__ import annotations

from tests.families.base import ModeFamily, torch_kernel

MODES = ("zeros", "skip_half", "raise", "scaled", "good")


class FaultyFamily(ModeFamily):
    name = "faulty"
    MODES = MODES
    DEFAULT = {"mode": "good"}

    def build(self, problem, tactic, device):
        good = torch_kernel(problem, device)
        mode = tactic["mode"]

        def kernel(x, w, out=None):
            if mode == "raise":
                raise RuntimeError("deliberate failure")
            y = good(x, w)
            if mode == "zeros":
                y.zero_()          # fast-but-wrong: an all-zero result
            elif mode == "scaled":
                y *= 1.5
            if out is None:
                return y
            if mode == "skip_half":
                out[: max(1, out.shape[0] // 2)] = y[: max(1, out.shape[0] // 2)]
                return out
            out.copy_(y)
            return out
        return kernel
