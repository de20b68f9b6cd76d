"""A test-only copy of the `cuda` family whose grouped-MoE runner is `autotune.tactics.cuda.moe_emulate.emulate`
(the kernel's grid ported to the CPU, CTA by CTA) behind the launcher's own argument check; every
other part (space, verdicts, stacked layout, build/bind checks, the shared bound launcher, the
launcher's scratch: split-K workspace and reduce rows from its ScratchPool, the bad-id word, the
opt-in raise) is the real family. It lets the grouped kernel's indexing be checked on the CPU
against float64."""
from __future__ import annotations

from autotune.tactics.base import Caps
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import moe_emulate as EMU
from tests.families.cuda_cpu import OnCpu


class _CpuMoeRun(MOE.MoeScratch):
    # not capture-safe; prefetch= checked as the launcher checks it, recorded (a hint: the port computes
    # without it); scratch_out= into the pool's view as the kernel does
    caps = Caps(checks_ids=True, shared_slot=True, prefetches=True, scratch_out=True)

    def __init__(self, problem, tactic, check_ids=None):
        self.problem, self.tactic = problem, tactic
        self.cfg = MOE.config(problem, tactic)
        self._init_scratch(check_ids)
        self.released = 0
        self.aligned_calls = 0
        self.prefetched: list = []

    def release(self) -> None:
        self.released += 1
        super().release()

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, shared_slot=False, aligned=None, prefetch=None,
                 scratch_out=False):
        so = scratch_out and out is None
        m, out = MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False, shared_slot=shared_slot,
                                alloc=not so)
        if so:
            out = self.out_view(m, x.device, 0)
            MOE.check_apart(self.problem, x, out)
            out.fill_(float("nan"))           # the emulation writes every row it owns: stale rows would show
        self.scratch_outs = getattr(self, "scratch_outs", 0) + so
        if prefetch is not None:
            MOE.check_prefetch(self.problem, prefetch, x)
        self.prefetched.append(prefetch)
        kind, rows = MOE.route(self.problem, self.cfg, m, shared_slot)
        MOE.check_alignment(self.problem, self.cfg, m, kind, rows, aligned, x.device)   # emulate forms the same groups
        self.aligned_calls += aligned is not None
        pairs = min(m, MOE.route(self.problem, self.cfg, m, shared_slot)[1]) * self.problem.top_k   # the largest launch's
        ws, _, bad = self._scratch(pairs, x.device)
        red, _ = self._reduce_scratch(pairs, x.device)
        EMU.emulate(self.problem, self.tactic, x, w, topk_ids, topk_weights, out, bad, ws=ws, red=red,
                    shared_slot=shared_slot)
        if self.check_ids:
            MOE.raise_if_bad(bad)
        return out

    def aligner(self, experts: int, block_m: int):
        """moe_align's alignment made on the CPU from its plain-Python reference (Triton's Aligner
        needs a GPU): the same sorted ids, blocks and sizes."""
        return lambda ids: cpu_alignment(ids, experts, block_m)


def cpu_alignment(ids, experts: int, block_m: int):
    import torch

    from autotune.tactics.triton_fp4 import moe_align as A
    pairs = ids.numel()
    srt, blocks, npad = A.reference(ids, experts, block_m)
    mb = A.max_blocks(pairs, experts, block_m)
    sorted_ids = torch.full((mb * block_m,), pairs, dtype=torch.int32)
    sorted_ids[:npad] = torch.tensor(srt, dtype=torch.int32)
    expert_ids = torch.full((mb,), -1, dtype=torch.int32)
    expert_ids[:len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    return A.Alignment(sorted_ids, expert_ids, torch.tensor([npad], dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), pairs, block_m, mb, 0)


class CudaMoeCpu(OnCpu):
    name = "cudamoecpu"

    def _moe_runner(self, problem, tactic, device):
        return _CpuMoeRun(problem, tactic)
