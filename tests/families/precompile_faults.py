"""A test-only family whose precompile fails the hard ways — hangs, segfaults — beside members
that compile and run (the torch kernel): the precompile stage must kill the hang past
--timeout-s, store both as failed with the stage and the signal, and the search goes on."""
from __future__ import annotations

import ctypes
import time

from tests.families import say_hanging
from tests.families.base import ModeFamily, torch_kernel

MODES = ("good", "hang", "segfault")


class PrecompileFaults(ModeFamily):
    compiles = True
    name = "pcfaults"
    MODES = MODES
    DEFAULT = {"mode": "good"}

    def precompile(self, problem, tactic, arch):
        if tactic["mode"] == "hang":
            say_hanging(tactic)
            time.sleep(3600)             # a compiler that never returns
        elif tactic["mode"] == "segfault":
            ctypes.string_at(0)
        return None

    def build(self, problem, tactic, device):
        return torch_kernel(problem, device)
