"""A test-only family whose precompile fails the hard ways — hangs, segfaults — beside members
that compile and run (the torch kernel): the precompile stage must kill the hang past
--timeout-s, store both as failed with the stage and the signal, and the search goes on."""
from __future__ import annotations

import ctypes
import time

from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import FamilyBase
from autotune.tactics.torch_ref import TorchFamily
from tests.families import say_hanging

MODES = ("good", "hang", "segfault")


class PrecompileFaults(FamilyBase):
    compiles = True
    name = "pcfaults"
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

    def precompile(self, problem, tactic, arch):
        if tactic["mode"] == "hang":
            say_hanging(tactic)
            time.sleep(3600)             # a compiler that never returns
        elif tactic["mode"] == "segfault":
            ctypes.string_at(0)
        return None

    def build(self, problem, tactic, device):
        return TorchFamily().build(problem, Tactic("torch", dequant_dtype="fp32", chunk_n=0), device)
