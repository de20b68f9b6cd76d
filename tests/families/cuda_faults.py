"""A test-only family for the GPU: one member writes far outside its buffer (a sticky
'illegal memory access' that poisons the CUDA context), the others are good. The worker must
report the failure, exit, and the next member must run in a fresh worker."""
from __future__ import annotations

from tests.families.base import ModeFamily, torch_kernel


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


class CudaFaultFamily(ModeFamily):
    name = "cuda_faults"
    MODES = ("good_a", "illegal_address", "good_b")
    DEFAULT = {"mode": "good_a"}

    def available(self, device):
        return (device == "cuda", "needs a GPU")

    def build(self, problem, tactic, device):
        good = torch_kernel(problem, device, dequant_dtype="bf16")
        mode = tactic["mode"]

        def kernel(x, w, out=None):
            if mode == "illegal_address":
                _poison()
            return good(x, w, out=out)
        return kernel
