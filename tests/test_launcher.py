"""The Launcher protocol (autotune.tactics.base): what every family's build and bind return
carries capture_safe, batch invariance, its routing (aligned block, checks ids), PDL and
release(); release() frees the scratch the launcher owns; FP4MoE asks the launchers for their
alignment (the runtime imports no family module); third-party families come in through the
`fp4_autotune.families` entry-point group. CPU only: launchers are built, not launched, where a
launch would need a GPU."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from autotune.core.formats import quantize
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.moe import FP4MoE
from autotune.tactics import registry
from autotune.tactics.base import (Caps, BoundKernel, BoundMoEKernel, FunctionKernel, Launcher, LauncherBase,
                                   as_launcher)
from autotune.tactics.triton_fp4 import moe_decode as md
from autotune.tactics.triton_fp4.w4a16 import tactic as w4a16_tactic

ROOT = Path(__file__).resolve().parents[1]
DENSE = Problem.dense(64, 128)
MOE = Problem.moe(64, 128, 4, 2)
def _is_launcher(obj) -> None:
    assert isinstance(obj, Launcher), type(obj)
    assert isinstance(obj.caps, Caps), type(obj).__name__


def _decode(**kw) -> Tactic:
    return Tactic("triton", {**dict(kernel="moe_decode", route="direct", block_m=16, block_n=32, block_k=128,
                                    split_k=1, num_warps=4, num_stages=3), **kw})


@pytest.mark.parametrize("problem,tactic", [
    (DENSE, Tactic("torch", dequant_dtype="fp32", chunk_n=0)),
    (MOE, Tactic("torch", dequant_dtype="fp32", chunk_n=0)),
    (DENSE, w4a16_tactic(16, 32, 64, 1, 4, 2, split_k=2)),
    (MOE, _decode()),
], ids=["torch-dense", "torch-moe", "triton-w4a16", "triton-moe_decode"])
def test_build_and_bind_return_launchers(problem, tactic):
    fam = registry.get(tactic.family)
    w = quantize(torch.randn(*((problem.experts,) if problem.kind == "grouped_moe" else ()), problem.n, problem.k))
    kernel = fam.build(problem, tactic, "cpu")
    bound = fam.bind(problem, tactic, fam.pack(fam.layout(tactic), w), "cpu")
    _is_launcher(kernel)
    _is_launcher(bound)
    # batch invariance on the bound launcher is the family's answer for the tactic
    assert bound.caps.batch_invariant is fam.batch_invariant(problem, tactic)
    assert bound.caps.pdl is False                        # no launcher here issues PDL launches
    bound.release()
    kernel.release()


def test_launcher_classes_of_the_gpu_families_implement_the_protocol():
    """cutlass, cublaslt and the cuda launch need a GPU to construct; their classes say it all."""
    from autotune.tactics.cublaslt import Launcher as LtLauncher
    from autotune.tactics.cuda.launch import Launch
    from autotune.tactics.cutlass.family import FlashInferMmFp4
    for cls in (LtLauncher, Launch, FlashInferMmFp4, md.MoEDecodeLauncher):
        assert issubclass(cls, LauncherBase) and "release" in dir(cls), cls
    assert Launch.caps.capture_safe is True and md.MoEDecodeLauncher.caps.capture_safe is True
    assert md.MoEDecodeLauncher.caps.checks_ids is True and LtLauncher.caps.checks_ids is False


def test_cutlass_release_drops_its_workspace_and_a_later_call_makes_it_again():
    from autotune.tactics.cutlass.family import FlashInferMmFp4, WeightOperands
    k = FlashInferMmFp4.__new__(FlashInferMmFp4)       # __init__ needs FlashInfer on a GPU
    k.problem, k.workspace, k._weight = DENSE, torch.empty(8, dtype=torch.uint8), None
    k.release()
    assert k.workspace is None and isinstance(k._weight, WeightOperands)


def test_moe_decode_release_frees_its_scratch():
    fam = registry.get("triton")
    k = fam.build(MOE, _decode(split_k=2), "cpu")
    k._scratch(2, 8, 4, torch.device("cpu"))
    k._scratch(2, 64, 4, torch.device("cpu"))                # outgrown: the first is retired
    assert k.scratch is k._own and k._own.bytes_held() > 0 and len(k._own.retired) == 1
    k.release()
    assert k._own.bufs == {} and k._own.retired == [] and (k._bad, k._aligner) == (None, None)
    assert k._scratch(2, 8, 4, torch.device("cpu"))[0].numel() >= 2 * 8 * MOE.n   # made again
    from autotune.tactics.scratch import ScratchPool
    shared = ScratchPool()                                   # attached (a dispatcher's): release leaves it
    k.attach(shared, torch.zeros(4, dtype=torch.int32)[:1])
    k._scratch(2, 8, 4, torch.device("cpu"))
    k.release()
    assert shared.bytes_held() > 0 and k.bad_word() is not None


def test_w4a16_release_frees_workspace_bound_scratch_and_plans():
    fam = registry.get("triton")
    t = w4a16_tactic(16, 32, 64, 1, 4, 2, split_k=2)
    k = fam.build(DENSE, t, "cpu")
    k._scratch(2, 4, torch.device("cpu"))
    k._scratch(2, 64, torch.device("cpu"))
    assert k._ws is not None and k._retired
    k.release()
    assert k._ws is None and k._locks is None and k._retired == []
    bound = fam.bind(DENSE, t, fam.pack(fam.layout(t), quantize(torch.randn(DENSE.n, DENSE.k))), "cpu")
    bound.scratch.get(0, "ws", 16, torch.float32, torch.device("cpu"))
    bound.scratch.get(0, "ws", 64, torch.float32, torch.device("cpu"))
    bound.plans[5] = ("a plan pointing into the scratch",)
    bound.release()
    assert bound.scratch.bufs == {} and bound.scratch.retired == [] and bound.plans == {}


def test_function_kernels_and_bound_kernels():
    calls = []

    def fn(x, w, out=None):
        calls.append((x, w, out))
        return "y"
    assert not isinstance(fn, LauncherBase)
    k = as_launcher(fn)
    assert isinstance(k, FunctionKernel) and k.caps.capture_safe is False and as_launcher(k) is k
    with pytest.raises(TypeError, match="not a kernel"):
        as_launcher(3)
    released = []
    safe = FunctionKernel(fn, capture_safe=True, release=lambda: released.append(1))
    w = quantize(torch.randn(DENSE.n, DENSE.k))
    b = registry.get("torch").bind_kernel(DENSE, safe, w, batch_invariant=True)
    assert type(b) is BoundKernel and b.caps.capture_safe and b.caps.batch_invariant and b._call is fn
    x = torch.zeros(2, DENSE.k, dtype=torch.bfloat16)
    assert b(x) == "y" and calls[-1][1] is w
    b.release()
    assert released == [1]
    moe = registry.get("torch").bind_kernel(MOE, fn, quantize(torch.randn(4, MOE.n, MOE.k)))
    assert type(moe) is BoundMoEKernel and moe.aligned_block_m(8) is None and moe.caps.checks_ids is False


class _Routed(LauncherBase):
    def __init__(self, bm):
        self.bm, self.asked = bm, []

    def aligned_block_m(self, m):
        return self.bm

    def aligner(self, experts, block_m):
        self.asked.append((experts, block_m))
        return lambda ids: SimpleNamespace(regroup=lambda bm: ("aligned", block_m, bm))


def test_fp4moe_takes_its_alignment_from_the_launcher_that_needs_the_larger_block():
    l13, l2 = _Routed(16), _Routed(64)
    blk = SimpleNamespace(_aligners={}, num_experts=8)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    need = lambda a, b: (a.aligned_block_m(4), b.aligned_block_m(4))  # noqa: E731  (what FP4MoE._run asks once)
    k13, k2 = FP4MoE._one_alignment(blk, l13, l2, ids, need(l13, l2))
    assert (k13, k2) == ({"aligned": ("aligned", 64, 16)}, {"aligned": ("aligned", 64, 64)})
    assert l2.asked == [(8, 64)] and l13.asked == []
    FP4MoE._one_alignment(blk, l13, l2, ids, need(l13, l2))     # one aligner per layer and BLOCK_M
    assert l2.asked == [(8, 64)]
    base = LauncherBase()
    assert FP4MoE._one_alignment(blk, l13, base, ids, need(l13, base)) == ({}, {})


def test_moe_decode_offers_moe_align():
    from autotune.tactics.triton_fp4.moe_align import Aligner
    k = registry.get("triton").build(MOE, _decode(route="aligned"), "cpu")
    assert k.aligned_block_m(4) == 16
    assert isinstance(k.aligner(MOE.experts, 16), Aligner)


def test_runtime_imports_no_family_module():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        import autotune.runtime.dispatch, autotune.runtime.nn, autotune.runtime.moe
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("autotune.tactics."))))""")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == ["autotune.tactics.base", "autotune.tactics.registry",
                                                     "autotune.tactics.scratch"]


def test_families_from_installed_entry_points(tmp_path):
    info = tmp_path / "fp4_autotune_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fp4-autotune-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fp4_autotune.families]\n"
                                           "rows = tests.families.rowwise:RowwiseFamily\n"
                                           "torch = tests.families.unknowns:UnknownsFamily\n")
    code = textwrap.dedent("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from autotune.tactics import registry
        print(json.dumps({"names": registry.names(), "rows": type(registry.get("rows")).__name__,
                          "torch": registry.FAMILIES["torch"], "extra": registry.extra(),
                          "warned": [str(w.message) for w in caught]}))""")
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert "rows" in got["names"] and got["rows"] == "RowwiseFamily"
    assert got["torch"] == "autotune.tactics.torch_ref:TorchFamily"        # a built-in is never replaced
    assert got["extra"] == {}            # installed, so every worker process finds it by itself
    assert any("torch" in w and "built-in" in w for w in got["warned"])
