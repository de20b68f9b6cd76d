"""A test-only copy of the `cuda` family whose grouped-MoE runner is `autotune.tactics.cuda.moe.emulate`
(the kernel's grid ported to the CPU, CTA by CTA) behind the launcher's own argument check; every
other part (space, verdicts, stacked layout, build/bind checks, the shared bound launcher) is the
real family. It lets the grouped kernel's indexing be checked on the CPU against float64."""
from __future__ import annotations

import torch

from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda.family import CudaFamily


class _CpuMoeRun:
    capture_safe = False
    checks_ids = True

    def __init__(self, problem, tactic):
        self.problem, self.tactic = problem, tactic
        self.bad = torch.zeros(1, dtype=torch.int32)
        self.released = 0

    def release(self) -> None:
        self.released += 1

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None):
        _, out = MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False)
        MOE.emulate(self.problem, self.tactic, x, w, topk_ids, topk_weights, out, self.bad)
        MOE.raise_if_bad(self.bad)
        return out


class CudaMoeCpu(CudaFamily):
    name = "cudamoecpu"
    depends_on = ("torch",)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def _moe_runner(self, problem, tactic, device):
        return _CpuMoeRun(problem, tactic)
