"""A test-only family whose launchers keep scratch as real ones do (a split-K workspace, a reduce
buffer): a tensor sized by the tactic and M, allocated on the first call of each M and kept on the
kernel. `LIVE` counts the scratch tensors alive, so a test can see what outlives a job. Modes:
"keep" (plain), "crowded" (raises CUDA out-of-memory while another tactic's scratch is alive — the
framework's memory, not the tactic's), "oom" (always out of memory: the tactic's own)."""
from __future__ import annotations

import weakref

import torch

from autotune.core.tactic import Tactic
from tests.families.base import ModeFamily, torch_kernel

MODES = ("keep", "crowded", "oom")
KBS = (64, 128, 256)               # scratch KiB per row
#: id(scratch) -> (tactic id, M, bytes) of every scratch tensor still alive
LIVE: dict[int, tuple[str, int, int]] = {}


def live_bytes() -> int:
    return sum(b for _, _, b in LIVE.values())


def _track(t: torch.Tensor, tactic_id: str, m: int) -> None:
    key = id(t)
    LIVE[key] = (tactic_id, m, t.numel() * t.element_size())
    weakref.finalize(t, LIVE.pop, key, None)


class ScratchyFamily(ModeFamily):
    name = "scratchy"
    MODES = MODES
    DEFAULT = {"mode": "keep", "kb": 64}

    def members(self):
        return [Tactic(self.name, mode=m, kb=kb) for m in MODES for kb in KBS]

    def validate(self, tactic):
        return super().validate(tactic) or (None if tactic.params.get("kb") in KBS else "bad kb")

    def build(self, problem, tactic, device):
        good = torch_kernel(problem, device)
        mode, kb, tid = tactic["mode"], tactic["kb"], tactic.id

        class Kernel:
            scratch: torch.Tensor | None = None

            def __call__(self, x, w, out=None):
                m = x.shape[0]
                if mode == "oom" or (mode == "crowded" and any(t != tid for t, _, _ in LIVE.values())):
                    raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {kb} KiB ({mode})")
                if self.scratch is None or self.scratch.numel() < kb * 256 * m:
                    self.scratch = torch.empty(kb * 256 * m, dtype=torch.float32, device=x.device)
                    _track(self.scratch, tid, m)
                y = good(x, w)
                if out is None:
                    return y
                out.copy_(y)
                return out

        return Kernel()
