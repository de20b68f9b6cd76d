"""A test-only family: the torch family whose chunked tactics get an unchecked verdict ("unknown:
..."), as a smem model outside the region it was checked on gives them."""
from __future__ import annotations

from autotune.core.tactic import UNKNOWN, Verdict
from autotune.tactics.torch_ref import TorchFamily


class UnknownsFamily(TorchFamily):
    name = "unknowns"
    default_rank = None

    def verdict_checked(self, problem, tactic, arch):
        if tactic["chunk_n"]:
            return Verdict(None, f"{UNKNOWN} chunk_n={tactic['chunk_n']} is outside the checked region")
        return super().verdict_checked(problem, tactic, arch)
