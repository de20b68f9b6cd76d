"""The cuda family on a CUDA GPU with CuPy (skipped elsewhere): float64 check of a few configs
at GLM-5 TP8 shapes, the bound prepacked launcher under CUDA-graph capture, the resource gate."""
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import detect
from autotune.core.problem import Problem
from autotune.tactics import registry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed")]


@pytest.mark.parametrize("p", [Problem.dense(3072, 6144), Problem.dense(6144, 1536), Problem.dense(6144, 256)],
                         ids=lambda p: p.key)
def test_configs_match_float64(p):
    fam, arch = registry.get("cuda"), detect()
    kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok]
    assert kept
    for m in (1, 13, 64, 100):
        s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
        ref = inputs.reference(p, s)
        for t in kept[:: max(1, len(kept) // 4)]:
            assert inputs.check(p, fam.build(p, t, "cuda"), s, ref) < 1e-2


def test_bound_launcher_replays_in_a_graph():
    p = Problem.dense(3072, 6144)
    fam, arch = registry.get("cuda"), detect()
    t = fam.default(p, arch)
    w = inputs.make_inputs(p, 1, "cuda", seed=3)[0].w
    launch = fam.bind(p, t, fam.pack(fam.layout(t), w), "cuda")
    x = torch.randn(8, p.k, device="cuda").to(torch.bfloat16)
    y = torch.empty(8, p.n, dtype=torch.bfloat16, device="cuda")
    launch(x, out=y)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch(x, out=y)
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, launch(x))
    with pytest.raises(TypeError, match="packed weight"):
        fam.bind(p, t, w, "cuda")


def test_loaded_functions_do_not_spill():
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda.family import config
    p, fam, arch = Problem.dense(3072, 6144), registry.get("cuda"), detect()
    t = fam.default(p, arch)
    for mt in B.M_TILES:
        r = B.runtime_resources(B.load(config(t, mt), f"sm_{arch.cc_int}", 0))
        assert r["local_size_bytes"] == 0 and r["shared_size_bytes"] == B.smem_bytes(config(t, mt))
