"""A test-only copy of the `cuda` family that runs on the CPU: the real layout (`pack`,
`pack_inplace`, verdicts, space), but the kernel is `layout.emulate_dequantize` (the kernel's
decode in torch bit operations) and a float32 matmul, since the real launch needs CuPy and a GPU.
It lets the one-copy binding be checked end to end on the CPU against float64."""
from __future__ import annotations

import torch

from autotune.core.operands import check_weight, out_checker, x_checker
from tactics.cuda import layout as L
from tactics.cuda.family import CudaFamily

BINDS: list[int] = []          # id of every pack a launcher was bound to


def _mm(x: torch.Tensor, p: L.CudaPacked, out=None) -> torch.Tensor:
    y = (x.float() @ L.emulate_dequantize(p).T).to(torch.bfloat16)
    return y if out is None else out.copy_(y)


class CudaCpu(CudaFamily):
    name = "cudacpu"
    depends_on = ("torch",)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def build(self, problem, tactic, device):
        def kernel(x, w, out=None):
            return _mm(x, w if isinstance(w, L.CudaPacked) else L.pack(w), out)
        return kernel

    def bind(self, problem, tactic, packed, device):
        if not isinstance(packed, L.CudaPacked):
            raise TypeError(f"cudacpu: bind needs the {L.LAYOUT} packed weight, got {type(packed).__name__}")
        check_weight(problem, packed)
        BINDS.append(id(packed))

        check, check_o = x_checker(problem, packed), out_checker(problem)   # as the cuda family binds

        def launch(x, out=None):
            check(x)
            if out is not None:
                check_o(x, out)
            return _mm(x, packed, out)
        launch.weight = packed  # type: ignore[attr-defined]
        return launch
