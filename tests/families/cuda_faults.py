"""A test-only family for the GPU: one member writes far outside its buffer (a sticky
'illegal memory access' that poisons the CUDA context), the others are good. The worker must
report the failure, exit, and the next member must run in a fresh worker."""
from __future__ import annotations

from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import FamilyBase
from autotune.tactics.torch_ref import TorchFamily


def _poison():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def wild_store(ptr):
        tl.store(ptr + (1 << 40), 1.0)

    buf = torch.zeros(16, device="cuda")
    wild_store[(1,)](buf)
    torch.cuda.synchronize()


class CudaFaultFamily(FamilyBase):
    name = "cuda_faults"
    depends_on = ("torch",)

    def available(self, device):
        return (device == "cuda", "needs a GPU")

    def enumerate(self, problem, arch):
        return [Tactic(self.name, mode=m) for m in ("good_a", "illegal_address", "good_b")] if problem.kind == "dense" else []

    def validate(self, tactic):
        return None

    def verdict(self, problem, tactic, arch):
        return Verdict.keep()

    def default(self, problem, arch):
        return Tactic(self.name, mode="good_a")

    def build(self, problem, tactic, device):
        good = TorchFamily().build(problem, Tactic("torch", dequant_dtype="bf16", chunk_n=0), device)
        mode = tactic["mode"]

        def kernel(x, w, out=None):
            if mode == "illegal_address":
                _poison()
            return good(x, w, out=out)
        return kernel
