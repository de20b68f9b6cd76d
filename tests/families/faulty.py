"""A test-only family whose members misbehave on purpose: wrong values, unwritten outputs, an
exception. The search must record each as failed with its reason and never pick it."""
from __future__ import annotations

import torch

from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import FamilyBase
from autotune.tactics.torch_ref import TorchFamily

MODES = ("zeros", "skip_half", "raise", "scaled", "good")


class FaultyFamily(FamilyBase):
    name = "faulty"
    depends_on = ("torch",)

    def available(self, device):
        return True, ""

    def enumerate(self, problem, arch):
        return [Tactic(self.name, mode=m) for m in MODES] if problem.kind == "dense" else []

    def validate(self, tactic):
        return None if tactic.params.get("mode") in MODES else "bad mode"

    def verdict(self, problem, tactic, arch):
        return Verdict.keep()

    def default(self, problem, arch):
        return Tactic(self.name, mode="good")

    def build(self, problem, tactic, device):
        good = TorchFamily().build(problem, Tactic("torch", dequant_dtype="fp32", chunk_n=0), device)
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
