"""How an inference engine's linear method calls fp4-autotune's dispatch (runs on the CPU).

The shape of vLLM's / SGLang's `LinearMethodBase`: `create_weights` at model construction,
`process_weights_after_loading` once the checkpoint is in, `apply` on every forward. This script
builds a two-layer MLP that way, tunes it (torch family on the CPU, a few buckets) into a temporary
cache unless $AUTOTUNE_CACHE points at one, then runs "decode" and "prefill" steps and prints
which rung of the ladder answered and which batch sizes were misses.

    python3 examples/engine_linear.py
"""
from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.runtime.dispatch import RUNGS, Dispatcher         # noqa: E402
from autotune.core.formats import FP4Weight, quantize        # noqa: E402
from autotune.core.problem import Problem                    # noqa: E402


class FP4LinearMethod:
    """What an engine plugs in for NVFP4 linear layers."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        layer.problem = Problem.dense(out_features, in_features)     # one Problem per (N, K)
        layer.in_features, layer.out_features = in_features, out_features

    def process_weights_after_loading(self, layer: nn.Module, weight: FP4Weight) -> None:
        # once per layer at load: check the weight, pack it once per layout its winners read and
        # bind one launcher per bucket; nothing of this happens per forward
        layer.bound = self.dispatcher.bind(layer.problem, weight)
        layer.table = layer.bound.table

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = layer.bound.launcher(x.shape[0])(x)          # the whole per-call cost of choosing
        return y if bias is None else y + bias


class EngineLinear(nn.Module):
    def __init__(self, method: FP4LinearMethod, in_features: int, out_features: int):
        super().__init__()
        self.method = method
        method.create_weights(self, in_features, out_features)

    def forward(self, x):
        return self.method.apply(self, x)


def tune(cache: Path, problems: list[Problem], buckets: tuple[int, ...]) -> None:
    from autotune.engine import timing
    from autotune.core.buckets import Buckets
    from autotune.core.env import current
    from autotune.engine.search import search
    from autotune.cache import Store
    from autotune.tactics import registry
    with Store(cache) as store:
        search(problems, families=[registry.get("torch")], store=store, buckets=Buckets(buckets), env=current(),
               timer=timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.02))


def main() -> None:
    torch.manual_seed(0)
    hidden, ffn = 512, 1024
    dense = [nn.Linear(hidden, ffn, bias=False), nn.Linear(ffn, hidden, bias=False)]   # checkpoint stand-in
    tmp = tempfile.TemporaryDirectory()
    cache = Path(os.environ.get("AUTOTUNE_CACHE") or Path(tmp.name) / "cache.db")
    if not cache.exists():
        print(f"tuning the MLP's two GEMMs into {cache} (CPU, torch family, buckets 1,8,64) ...")
        tune(cache, [Problem.dense(ffn, hidden), Problem.dense(hidden, ffn)], (1, 8, 64))
    warnings.simplefilter("ignore")      # the default rung warns once per problem; counted below
    dispatcher = Dispatcher(cache, misses="memory")
    method = FP4LinearMethod(dispatcher)
    up, down = EngineLinear(method, hidden, ffn), EngineLinear(method, ffn, hidden)
    fp4 = [quantize(lin.weight.detach()) for lin in dense]
    for layer, w in ((up, fp4[0]), (down, fp4[1])):
        method.process_weights_after_loading(layer, w)
    w_up, w_down = (w.dequantize(torch.float64) for w in fp4)     # the FP4 weights, exactly

    for m in (1, 1, 3, 8, 8, 64, 200):          # decode steps, then prefill chunks
        x = torch.randn(m, hidden, dtype=torch.bfloat16)
        y = down(torch.nn.functional.silu(up(x)))
        h = torch.nn.functional.silu(up(x)).double()    # compare each GEMM with float64 on the same input
        ref = h @ w_down.T
        err = float((y.double() - ref).norm() / ref.norm())
        print(f"M={m:4}  up: {up.table.rung_for(m)[0]:8} down: {down.table.rung_for(m)[0]:8} "
              f"rel.err of down vs float64 {err:.1e}")
    print("calls per rung:", {r: n for r, n in zip(RUNGS, [sum(c) for c in zip(up.table.counts, down.table.counts)])})
    attn = EngineLinear(method, hidden, 3 * hidden)  # a layer nobody tuned: default rung, a counted miss
    method.process_weights_after_loading(attn, quantize(torch.randn(3 * hidden, hidden)))
    attn(torch.randn(5, hidden, dtype=torch.bfloat16))
    print("misses (problem, M) -> calls:", dict(dispatcher.misses))
    print("load-time skips:", dict(dispatcher.skipped) or "none")


if __name__ == "__main__":
    main()
