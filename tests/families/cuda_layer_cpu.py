"""A test-only copy of the `cuda` family whose layer runner is `autotune.tactics.cuda.moe_layer_emulate.emulate`
(the layer kernel's two roles ported to the CPU) behind the launcher's own argument checks; the layer
kernel's space and verdicts are taken for sm_90 (the CPU has no arch it runs on), and every other part
(precompile's walk, build's checks, both weights packed once each, the caps) is the real family's. It lets a layer search
measure the one-launch layer kernel beside the torch compositions and the pair on the CPU."""
from __future__ import annotations

from autotune.core.arch import ARCHS
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import moe_layer as LAYER
from autotune.tactics.cuda import moe_layer_emulate as EMU
from tests.families.cuda_cpu import OnCpu

CALLS: list[int] = []          # M of every call the runner made


class _CpuLayerRun:
    def __init__(self, problem, tactic):
        import torch
        self.problem, self.tactic, self.p2 = problem, tactic, LAYER.w2_problem(problem)
        self.bad = torch.zeros(1, dtype=torch.int32)

    def words(self, dev=None):
        """LayerLaunch's (state, counters, h, bad): the port keeps only the bad-id word."""
        return None, None, None, self.bad

    def __call__(self, x, w13, w2, topk_ids, topk_weights=None, out=None, shared_slot=False):
        p = self.problem
        m, _ = MOE.check_call(p, x, w13, topk_ids, None, None, cuda=False, shared_slot=shared_slot, alloc=False)
        y = EMU.emulate(p, self.tactic, x, w13, w2, topk_ids, topk_weights, bad=self.bad, shared_slot=shared_slot)
        CALLS.append(m)
        return y if out is None else out.copy_(y)


class CudaLayerCpu(OnCpu):
    name = "cudalayercpu"

    def precompile(self, problem, tactic, arch):
        """The real precompile's walk (the layer's w13 problem, its member's configs) with the text's
        static shared memory in place of NVRTC's cubin (CuPy is not here)."""
        from autotune.tactics.cuda import build as B
        from autotune.tactics.cuda.family import member_of
        sub = problem.w13 if problem.kind == "moe_layer" else problem
        return max(B.smem_bytes(c) for c in member_of(tactic).impl().configs(sub, tactic))

    @staticmethod
    def _arch(problem, arch):
        return ARCHS["sm90"] if problem.kind == "moe_layer" else arch

    def enumerate(self, problem, arch):
        return super().enumerate(problem, self._arch(problem, arch))

    def verdict_checked(self, problem, tactic, arch):
        return super().verdict_checked(problem, tactic, self._arch(problem, arch))

    def _layer_runner(self, problem, tactic, device):
        return _CpuLayerRun(problem, tactic)
