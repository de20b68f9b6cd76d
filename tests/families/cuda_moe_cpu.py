"""A test-only copy of the `cuda` family whose grouped-MoE runner is `autotune.tactics.cuda.moe.emulate`
(the kernel's grid ported to the CPU, CTA by CTA) behind the launcher's own argument check; every
other part (space, verdicts, stacked layout, build/bind checks, the shared bound launcher, the
launcher's scratch: split-K workspace and reduce rows from its ScratchPool, the bad-id word, the
opt-in raise) is the real family. It lets the grouped kernel's indexing be checked on the CPU
against float64."""
from __future__ import annotations

from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda.family import CudaFamily


class _CpuMoeRun(MOE.MoeScratch):
    capture_safe = False
    checks_ids = True
    shared_slot = True

    def __init__(self, problem, tactic, check_ids=None):
        self.problem, self.tactic = problem, tactic
        self.cfg = MOE.config(problem, tactic)
        self._init_scratch(check_ids)
        self.released = 0

    def release(self) -> None:
        self.released += 1
        super().release()

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, shared_slot=False):
        m, out = MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False, shared_slot=shared_slot)
        pairs = min(m, MOE.route(self.problem, self.cfg, m, shared_slot)[1]) * self.problem.top_k   # the largest launch's
        ws, _, bad = self._scratch(pairs, x.device)
        red, _ = self._reduce_scratch(pairs, x.device)
        MOE.emulate(self.problem, self.tactic, x, w, topk_ids, topk_weights, out, bad, ws=ws, red=red,
                    shared_slot=shared_slot)
        if self.check_ids:
            MOE.raise_if_bad(bad)
        return out

    def chunk_tokens(self, m: int = 1) -> int:
        return MOE.route(self.problem, self.cfg, m)[1]


class CudaMoeCpu(CudaFamily):
    name = "cudamoecpu"
    depends_on = ("torch",)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def _moe_runner(self, problem, tactic, device):
        return _CpuMoeRun(problem, tactic)
