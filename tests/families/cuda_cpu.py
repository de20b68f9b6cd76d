"""A test-only copy of the `cuda` family that runs on the CPU: the real layout (`pack`,
`pack_inplace`, verdicts, space) and the real `build`/`bind` (every check, the shared bound
launcher); only the runner differs: `layout.emulate_dequantize` (the kernel's decode in torch bit
operations) and a float32 matmul, since the real launch needs CuPy and a GPU. It lets the one-copy
binding be checked end to end on the CPU against float64."""
from __future__ import annotations

import torch

from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda.family import CudaFamily

BINDS: list[int] = []          # id of every pack a launcher was bound to


def _mm(x: torch.Tensor, p: L.CudaPacked, out=None) -> torch.Tensor:
    y = (x.float() @ L.emulate_dequantize_any(p).T).to(torch.bfloat16)
    return y if out is None else out.copy_(y)


class OnCpu(CudaFamily):
    """The cuda family available on the CPU (its runners replaced by a subclass), needing only torch."""
    depends_on = ("torch",)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""


class CudaCpu(OnCpu):
    name = "cudacpu"

    def _runner(self, problem, tactic, device):
        return _mm

    def bind(self, problem, tactic, packed, device):
        launch = super().bind(problem, tactic, packed, device)      # the cuda family's checks, unchanged
        BINDS.append(id(packed))
        return launch


class CudaDenseCpu(OnCpu):
    """The cuda family whose dense runner is `autotune.tactics.cuda.dense.emulate` (the kernel's grid
    ported to the CPU: row chunks, split-K partials and counters, SwiGLU's gate/up tile pairs) behind
    the launcher's own argument check; everything else is the real family."""
    name = "cudadensecpu"

    def _runner(self, problem, tactic, device):
        from autotune.tactics.cuda import dense as D
        return D.emulate_runner(problem, tactic)
