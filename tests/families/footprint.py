"""A test-only family that compiles: the torch family with a made-up shared-memory model and a
"compiler" (`precompile`) that disagrees with it on two configs, so --compile-check's verdict audit
has a kept tactic over the limit and a rejected one that fits to find."""
from __future__ import annotations

from autotune.core.tactic import Verdict
from autotune.tactics.torch_ref import TorchFamily

#: the static model's bytes per chunk_n, and what the compiler allocates instead where they differ
MODEL = {0: 60_000, 512: 120_000, 2048: 300_000}
COMPILED = {("fp32", 512): 250_000, ("bf16", 2048): 50_000}


class FootprintFamily(TorchFamily):
    name = "footprint"
    default_rank = None
    compiles = True

    def verdict_checked(self, problem, tactic, arch):
        need, limit = MODEL[tactic["chunk_n"]], arch.smem_per_block_optin
        if need > limit:
            return Verdict.reject(f"smem {need} > {limit}", smem=need, limit=limit)
        return Verdict.keep(need, limit)

    def precompile(self, problem, tactic, arch):
        return COMPILED.get((tactic["dequant_dtype"], tactic["chunk_n"]), MODEL[tactic["chunk_n"]])
