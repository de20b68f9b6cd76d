"""A test-only grouped-MoE family whose launcher keeps the GPU members' contract with device ops
only (nothing is ever read on the host): ids -1 give zero rows, ids outside [-1, E) NaN rows and
the sticky bad-id word (its own, or the one `attach` gives), split-K partials stored to a
workspace [split_k, P, N] and summed in split order, the reduce epilogue's fp32 rows [P, N] — both
taken from its ScratchPool (its own, or the dispatcher's after `attach`) with moe_decode's sizes,
so a test can count what forces a device→host read on a forward and what scratch the layers hold.
`caps.capture_safe` and `caps.checks_ids` are True, as for moe_decode and moe_mma."""
from __future__ import annotations

import torch

from autotune.core import settings
from autotune.core.operands import out_shape
from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import Caps, FamilyBase, LauncherBase
from autotune.tactics.scratch import ScratchPool, stream_key

SPLITS = (1, 2, 4)


class DeviceMoELauncher(LauncherBase):
    caps = Caps(capture_safe=True, checks_ids=True, batch_invariant=True)

    def __init__(self, problem, split_k: int):
        self.problem, self.split_k = problem, split_k
        self.scratch = self._own = ScratchPool()
        self._bad = self._attached = None
        self.check_ids = settings.check_ids()
        self._deq: dict[int, tuple[object, torch.Tensor]] = {}

    def attach(self, scratch=None, bad_word=None) -> None:
        if scratch is not None:
            self.scratch = scratch
        if bad_word is not None:
            self._attached = bad_word

    def bad_word(self):
        return self._attached if self._attached is not None else self._bad

    def release(self) -> None:
        self._own.clear()
        self._deq.clear()

    def _word(self, device):
        if self._attached is not None:
            return self._attached
        if self._bad is None:
            self._bad = torch.zeros(1, dtype=torch.int32, device=device)
        return self._bad

    def _weights(self, w) -> torch.Tensor:
        hit = self._deq.get(id(w))
        if hit is None or hit[0] is not w:
            hit = self._deq[id(w)] = (w, w.dequantize(torch.float32))
        return hit[1]

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, aligned=None):
        p = self.problem
        m, top_k = topk_ids.shape
        e, n, k = p.experts, p.n, p.k
        pairs = m * top_k
        dev = x.device
        s = stream_key(dev)
        if out is None:
            out = torch.empty(out_shape(p, m), dtype=torch.bfloat16, device=dev)
        ids = topk_ids.reshape(-1).long()
        bad = (ids < -1) | (ids >= e)
        live = (ids >= 0) & ~bad
        word = self._word(dev)
        word.bitwise_or_(bad.any().to(word.dtype))
        wd = self._weights(w)[ids.clamp(0, e - 1)]                         # [P, N, K]
        xr = (x.reshape(pairs, k) if x.dim() == 3 else x.repeat_interleave(top_k, 0)).float()
        if self.split_k > 1:
            ws = self.scratch.get(s, "splitk.ws", self.split_k * pairs * n, torch.float32, dev)
            part = ws[:self.split_k * pairs * n].view(self.split_k, pairs, n)
            kc = k // self.split_k
            for z in range(self.split_k):                                   # partials stored, then summed in order
                part[z] = torch.einsum("pk,pnk->pn", xr[:, z * kc:(z + 1) * kc], wd[..., z * kc:(z + 1) * kc])
            y = part[0].clone()
            for z in range(1, self.split_k):
                y += part[z]
        else:
            y = torch.einsum("pk,pnk->pn", xr, wd)
        if p.epilogue == "swiglu":
            y = torch.nn.functional.silu(y[:, :n // 2]) * y[:, n // 2:]
        if topk_weights is not None:
            y = y * topk_weights.reshape(-1, 1).float()
        y = torch.where(live[:, None], y, torch.zeros((), device=dev))
        y = torch.where(bad[:, None], torch.full((), float("nan"), device=dev), y)
        if p.epilogue == "reduce":
            rows = self.scratch.get(s, "reduce.rows", pairs * n, torch.float32, dev)[:pairs * n].view(m, top_k, n)
            rows.copy_(y.view(m, top_k, n))
            acc = rows[:, 0].clone()
            for j in range(1, top_k):                                        # slot order
                acc += rows[:, j]
            out.copy_(acc)
        else:
            out.copy_(y.view(out.shape))
        if self.check_ids and bool(word.item()):
            word.zero_()
            raise ValueError("topk_ids holds expert ids outside [-1, E) (ids >= E or < -1 are refused)")
        return out


class DeviceMoEFamily(FamilyBase):
    name = "devicemoe"
    depends_on = ("torch",)
    default_rank = None

    def supports(self, problem):
        if problem.kind != "grouped_moe" or problem.a_fmt != "bf16":
            return "devicemoe runs bf16 grouped_moe problems only"
        return None

    def enumerate(self, problem, arch):
        return [Tactic(self.name, split_k=s) for s in SPLITS if problem.k % s == 0]

    def validate(self, tactic):
        return None if tactic.params.get("split_k") in SPLITS else f"split_k must be one of {SPLITS}"

    def verdict_checked(self, problem, tactic, arch):
        return Verdict.keep() if problem.k % tactic["split_k"] == 0 else Verdict.reject("split_k does not divide K")

    def default(self, problem, arch):
        return Tactic(self.name, split_k=1)

    def batch_invariant(self, problem, tactic):
        return True

    def build(self, problem, tactic, device):
        return DeviceMoELauncher(problem, int(tactic["split_k"]))
