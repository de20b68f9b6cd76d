"""A test-only family that shows when compiles and builds happen (tests/test_pipeline.py): every
precompile and every build appends a line to a log file, so a test reads their order (sequence,
not wall-clock). `gated` compiles, for one problem, only once a build has run (it waits for the
file the first build creates): with the compile stage as a barrier it can never finish; overlapped with measuring it
finishes as soon as a job measures. `nocompile` fails to compile (and to build, as a real Triton
config that does not compile fails its JIT too); `hang` (enumerated only with HANG set) compiles
forever. The members sleep different times, far apart (a loaded CI machine's noise stays well below), and the
fastest is the designated default, so it wins."""
from __future__ import annotations

import os
import time

import torch

from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import FamilyBase, FunctionKernel
from autotune.tactics.torch_ref import OUT
from tests.families import say_hanging

LOG = "AUTOTUNE_TEST_COMPILE_LOG"       # file: "compile-start|compile-end|build <n> <tactic id>" lines
GO = "AUTOTUNE_TEST_COMPILE_GO"         # "<n>:<file>": the first build creates the file; `gated` waits for it at N = n
GATED_HANGS = "AUTOTUNE_TEST_GATED_HANGS"  # "1": a `gated` left waiting says it hangs (a test where no build can come)
HANG = "AUTOTUNE_TEST_COMPILE_HANG"     # "1": enumerate a member whose precompile never returns
#: (mode, sleep_ms) of the members, fastest first; the default is the fastest (the winner: nothing beats it)
MEMBERS = (("good", 0.0), ("gated", 150.0), ("good", 200.0), ("good", 250.0), ("nocompile", 300.0))


def log(event: str, problem, tactic: Tactic) -> None:
    if os.environ.get(LOG):
        with open(os.environ[LOG], "a") as f:          # one short O_APPEND write: lines never mix
            f.write(f"{event} {problem.n} {tactic.id}\n")


class CompileOrder(FamilyBase):
    compiles = True
    name = "corder"
    depends_on = ("torch",)
    default_rank = -1     # registered, its own fastest member is the designated default (not torch's)

    def available(self, device):
        return True, ""

    def supports(self, problem):
        return None if problem.kind == "dense" and problem.a_fmt == "bf16" else "corder: dense bf16 problems only"

    def enumerate(self, problem, arch):
        if problem.kind != "dense":
            return []
        extra = (("hang", 350.0),) if os.environ.get(HANG) == "1" else ()
        return [Tactic(self.name, mode=m, sleep_ms=s) for m, s in MEMBERS + extra]

    def validate(self, tactic):
        return None if tactic.params.get("mode") in ("good", "gated", "nocompile", "hang") else "bad mode"

    def verdict(self, problem, tactic, arch):
        return Verdict.keep()

    def default(self, problem, arch):
        return Tactic(self.name, mode="good", sleep_ms=0.0)

    def precompile(self, problem, tactic, arch):
        log("compile-start", problem, tactic)
        if tactic["mode"] == "nocompile":
            raise RuntimeError("ptxas error: entry function uses too much shared data")
        if tactic["mode"] == "hang":
            say_hanging(tactic)
            time.sleep(3600)
        n, _, go = os.environ.get(GO, "").partition(":")
        if tactic["mode"] == "gated" and go and problem.n == int(n):
            if not os.path.exists(go) and os.environ.get(GATED_HANGS) == "1":
                say_hanging(tactic)                       # a barrier: no build can come to let it go
            while not os.path.exists(go):                 # the search kills it past --timeout-s
                time.sleep(0.02)
        log("compile-end", problem, tactic)
        return None

    def build(self, problem, tactic, device):
        log("build", problem, tactic)
        if os.environ.get(GO):
            open(os.environ[GO].partition(":")[2], "a").close()
        if tactic["mode"] in ("nocompile", "hang"):
            raise RuntimeError("ptxas error: the JIT fails as the precompile did")
        odt, pause, deq = OUT[problem.out_dtype], tactic["sleep_ms"] / 1e3, {}

        def kernel(x, w, out=None):      # each input set's weight dequantized once: the sleep, not a
            key = (w.packed.data_ptr(), tuple(w.packed.shape))      # loaded CPU, ranks the members
            if key not in deq:
                deq[key] = w.dequantize(torch.float32)
            y = (x.float() @ deq[key].T).to(odt)
            time.sleep(pause)
            if out is None:
                return y
            out.copy_(y)
            return out
        return FunctionKernel(kernel)
