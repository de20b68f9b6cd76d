"""A test-only family whose chunked tactics say they are useful only at M <= 2 (Family.useful): the
torch family's kernels otherwise, so a search's trials show what the hook skips."""
from __future__ import annotations

from autotune.tactics.torch_ref import TorchFamily


class DecodeOnlyFamily(TorchFamily):
    name = "decodeonly"
    default_rank = None

    def useful(self, problem, tactic, m):
        return tactic["chunk_n"] == 0 or m <= 2
