"""A test-only family for --batch-invariant: the torch family's kernels run one row at a time, so
a row's result cannot depend on the batch (true by construction, and said by `batch_invariant`)."""
from __future__ import annotations

import torch

from autotune.tactics.torch_ref import TorchFamily


class RowwiseFamily(TorchFamily):
    name = "rowwise"
    default_rank = None

    def build(self, problem, tactic, device):
        inner = super().build(problem, tactic, device)
        if problem.kind != "dense":
            return inner

        def kernel(x, w, out=None):
            rows = [inner(x[i:i + 1], w) for i in range(x.shape[0])]
            y = torch.cat(rows) if rows else inner(x, w)
            if out is not None:
                out.copy_(y)
                return out
            return y
        return kernel

    def batch_invariant(self, problem, tactic):
        return problem.kind == "dense"
