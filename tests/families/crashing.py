"""A test-only family whose members fail the hard ways: segfault, hang, exit, raise, all-zero
output, plus good members that sleep for different times (so their ranking is known). Only
process isolation survives the first three; the search must store each as failed and go on."""
from __future__ import annotations

import ctypes
import os
import time

from autotune.core.tactic import Tactic, Verdict
from tests.families import say_hanging
from tests.families.base import ModeFamily, torch_kernel

BAD = ("segfault", "hang", "exit", "raise", "zeros", "nocompile")
SLEEP_MS = (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0)   # good members, fastest first
BUILD_LOG = "AUTOTUNE_TEST_BUILD_LOG"                    # file that build() appends tactic ids to


class CrashingFamily(ModeFamily):
    compiles = True    # its precompile() runs in the engine's compile pool
    name = "crashing"
    MODES = BAD + ("good", "oversized")
    DEFAULT = {"mode": "good", "sleep_ms": SLEEP_MS[-1]}

    def members(self):
        return ([Tactic(self.name, mode=m, sleep_ms=0.0) for m in BAD]
                + [Tactic(self.name, mode="good", sleep_ms=s) for s in SLEEP_MS]
                + [Tactic(self.name, mode="oversized", sleep_ms=0.0)])

    def verdict_checked(self, problem, tactic, arch):
        if tactic["mode"] == "oversized":   # stands for a config over the smem limit
            return Verdict.reject("smem 300000 > limit 101376", 300000, 101376)
        return Verdict.keep()

    def precompile(self, problem, tactic, arch):
        """Stands for a compiler that rejects one member (a compile failure is a trial too)."""
        if tactic["mode"] == "nocompile":
            raise RuntimeError("ptxas error: entry function uses too much shared data")
        return None

    def build(self, problem, tactic, device):
        if os.environ.get(BUILD_LOG):
            with open(os.environ[BUILD_LOG], "a") as f:
                f.write(tactic.id + "\n")
        good = torch_kernel(problem, device)
        mode, pause = tactic["mode"], tactic["sleep_ms"] / 1e3

        def kernel(x, w, out=None):
            if mode == "segfault":
                ctypes.string_at(0)              # a real SIGSEGV, like an illegal address in a kernel
            elif mode == "hang":
                say_hanging(tactic)
                time.sleep(3600)
            elif mode == "exit":
                os._exit(7)
            elif mode == "raise":
                raise RuntimeError("deliberate failure")
            y = good(x, w)
            if mode == "zeros":
                y.zero_()
            if pause:
                time.sleep(pause)
            if out is None:
                return y
            out.copy_(y)
            return out
        return kernel


class SleepyFamily(CrashingFamily):
    """Only the good, sleeping members (and no compile step): for tests of halving in a real search
    that must not wait for a hang's timeout."""

    compiles = False
    name = "sleepy"

    def members(self):
        return [Tactic(self.name, mode="good", sleep_ms=s) for s in SLEEP_MS]
