"""The search precompiles exactly the Triton kernels its worker then launches.

A grouped member's routing (E, top_k) and epilogue are constexprs of its kernel: a launch whose
constexprs differ from what `Family.precompile` put in Triton's cache compiles again at its first
call, inside the worker, serially, in the stage timed as "check: run". GLM-5's folded shared-expert
problems (e257:top9) did that for every Triton tactic while `sources` compiled GLM-5's unfolded
routing (256, 8): the H100/H200 main jobs spent 100-160 s there before 2026-12-06.

Here the real launchers run the search's calls (routed inputs, x a row per token or per pair as the
epilogue reads, every bucket's route, alignment and token chunks) on meta tensors with the kernels
replaced by a recorder, and every launch's kernel, constexprs and options must be among the
precompiled sources'.
"""
from __future__ import annotations

import pytest
import torch

from autotune.core.arch import get_arch
from autotune.core.formats import FP4Weight
from autotune.core.problem import Problem
from autotune.tactics.triton_fp4 import TritonFamily
from autotune.tactics.triton_fp4 import kernel as tkernel
from autotune.tactics.triton_fp4 import moe_align, moe_decode_kernel
from autotune.tactics.triton_fp4.family import member_of

# GLM-5 TP8's routed w13 / w2 shapes, unfolded (e256:top8) and with the shared expert folded in
# (e257:top9), plain and with their fused epilogues: the grouped problems its main job tunes
SHAPES = ((512, 6144), (6144, 256))
PROBLEMS = [Problem.moe(n, k, e, t, "nvfp4").variant(epi)
            for e, t in ((256, 8), (257, 9)) for (n, k), epi in zip(SHAPES, ("swiglu", "reduce"))
            for epi in ("none", epi)]
DENSE = [Problem.dense(n, k, "nvfp4") for n, k in ((3072, 6144), (512, 6144), (6144, 1536), (6144, 256))]
BUCKETS = (1, 4, 32, 64, 512, 8192)     # direct and aligned routes, split-K token chunks at the top
# the launcher's interpreter switches (DEQ_ASM, DOT_F32) follow TRITON_INTERPRET; the recorder runs
# the launchers in interpreter mode to let meta tensors through their device check
INTERP_KEYS = {"DEQ_ASM", "DOT_F32"}


class Recorder:
    """Stands in for @triton.jit kernels: `kernel[grid](*args, **kw)` records (kernel, options, constexprs)."""

    def __init__(self):
        self.launches: list[tuple[str, tuple, tuple]] = []

    def kernel(self, name: str):
        rec = self

        class Kernel:
            def __getitem__(self, grid):
                def launch(*args, num_warps, num_stages=None, **consts):
                    opts = (("num_warps", int(num_warps)),) if num_stages is None else \
                        (("num_stages", int(num_stages)), ("num_warps", int(num_warps)))
                    consts = tuple(sorted((k, int(v)) for k, v in consts.items() if k not in INTERP_KEYS))
                    rec.launches.append((name, opts, consts))
                return launch
        return Kernel()


def _dense_inputs(p: Problem, m: int):
    meta = "meta"
    w = FP4Weight(torch.empty(p.n, p.k // 2, dtype=torch.uint8, device=meta),
                  torch.empty(p.n, p.k // p.block, dtype=torch.float8_e4m3fn, device=meta),
                  torch.empty((), dtype=torch.float32, device=meta), p.w_fmt)
    return torch.empty(m, p.k, dtype=torch.bfloat16, device=meta), w


def _inputs(p: Problem, m: int):
    """The search's inputs (autotune.core.inputs.make_inputs) as meta tensors: routed, one global
    scale per expert, x a row per pair for "reduce"."""
    meta = "meta"
    lead = (m, p.top_k) if p.epilogue == "reduce" else (m,)
    x = torch.empty(*lead, p.k, dtype=torch.bfloat16, device=meta)
    w = FP4Weight(torch.empty(p.experts, p.n, p.k // 2, dtype=torch.uint8, device=meta),
                  torch.empty(p.experts, p.n, p.k // p.block, dtype=torch.float8_e4m3fn, device=meta),
                  torch.empty(p.experts, dtype=torch.float32, device=meta), p.w_fmt)
    return (x, w, torch.empty(m, p.top_k, dtype=torch.int32, device=meta),
            torch.empty(m, p.top_k, dtype=torch.float32, device=meta))


def _compiled(sources) -> set[tuple[str, tuple, tuple]]:
    out = set()
    for src, options in sources:
        names = src.fn.arg_names
        consts = tuple(sorted((names[i], int(v)) for (i,), v in src.constants.items() if names[i] not in INTERP_KEYS))
        out.add((src.fn.__name__, tuple(sorted((k, int(v)) for k, v in options.items())), consts))
    return out


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key.split("->bf16:")[1])
def test_every_launch_of_the_search_hits_a_precompiled_kernel(problem, monkeypatch):
    fam, sm90 = TritonFamily(), get_arch("sm90")
    tactics = [t for t in fam.enumerate(problem, sm90)
               if t["kernel"] in ("moe_decode", "moe_w4a16") and fam.verdict(problem, t, sm90).ok]
    assert {t["kernel"] for t in tactics} == ({"moe_decode", "moe_w4a16"} if problem.epilogue == "none"
                                             else {"moe_decode"})
    # what Family.precompile compiles for the problem, before the kernels are replaced
    wants = {t.id: _compiled(member_of(t["kernel"]).sources(problem.w_fmt, t.params, problem)) for t in tactics}
    rec = Recorder()
    for mod, name in ((moe_decode_kernel, "moe_decode_kernel"), (tkernel, "moe_w4a16_kernel"),
                      (moe_align, "_moe_count_kernel"), (moe_align, "_moe_scatter_kernel")):
        monkeypatch.setattr(mod, name, rec.kernel(name))
    missed, kernels = [], set()
    for t in tactics:
        want = wants[t.id]
        launcher = fam.build(problem, t, "cpu")
        launcher.interpret = True          # meta tensors past the device check (INTERP_KEYS above)
        for m in BUCKETS:
            rec.launches.clear()
            x, w, ids, tw = _inputs(problem, m)
            launcher(x, w, ids, tw, out=None)
            assert rec.launches, (t.id, m)
            kernels |= {k for k, _, _ in rec.launches}
            missed += [(t.id, m, k, dict(c)) for k, o, c in rec.launches if (k, o, c) not in want]
    assert not missed, f"{len(missed)} launches compile in the worker, e.g. {missed[0]}"
    # the alignment ran (moe_decode's aligned route) and was checked with the GEMMs
    assert {"_moe_count_kernel", "_moe_scatter_kernel"} <= kernels


def test_without_a_problem_sources_compile_glm5s_routing():
    """cross_compile (the smem figure, no problem at hand) keeps its representative routing."""
    t = dict(kernel="moe_decode", route="aligned", block_m=16, block_n=64, block_k=128, split_k=1,
             num_warps=4, num_stages=3)
    (src, _), = member_of("moe_decode").sources("nvfp4", t)
    names = src.fn.arg_names
    consts = {names[i]: v for (i,), v in src.constants.items()}
    assert (consts["NUM_EXPERTS"], consts["TOP_K"], consts["SWIGLU"], consts["REDUCE"]) == (256, 8, 0, 0)
    folded = Problem.moe(512, 6144, 257, 9, "nvfp4").variant("swiglu")
    *align, (src, _) = member_of("moe_decode").sources("nvfp4", t, folded)
    consts = {names[i]: v for (i,), v in src.constants.items()}
    assert (consts["NUM_EXPERTS"], consts["TOP_K"], consts["SWIGLU"], consts["REDUCE"]) == (257, 9, 1, 0)
    # with the problem, the alignment kernels its aligned route launches come first (E = 257)
    assert [s.fn.__name__ for s, _ in align] == ["_moe_count_kernel"] + ["_moe_scatter_kernel"] * 4
    assert {s.constants[(s.fn.arg_names.index("NUM_EXPERTS"),)] for s, _ in align} == {257}


@pytest.mark.parametrize("problem", DENSE, ids=lambda p: p.key.split("->bf16:")[1])
def test_every_dense_launch_hits_a_precompiled_kernel(problem, monkeypatch):
    """GLM-5's dense problems on w4a16_dequant (every split and its row chunks)."""
    fam, sm90 = TritonFamily(), get_arch("sm90")
    tactics = [t for t in fam.enumerate(problem, sm90)
               if t["kernel"] == "w4a16_dequant" and fam.verdict(problem, t, sm90).ok]
    assert len(tactics) > 20
    wants = {t.id: _compiled(member_of(t["kernel"]).sources(problem.w_fmt, t.params, problem)) for t in tactics}
    rec = Recorder()
    monkeypatch.setattr(tkernel, "w4a16_dequant_kernel", rec.kernel("w4a16_dequant_kernel"))
    missed = []
    for t in tactics:
        launcher = fam.build(problem, t, "cpu")
        for m in BUCKETS:
            rec.launches.clear()
            launcher.launch(*_dense_inputs(problem, m))
            assert rec.launches, (t.id, m)
            missed += [(t.id, m, dict(c)) for k, o, c in rec.launches if (k, o, c) not in wants[t.id]]
    assert not missed, f"{len(missed)} launches compile in the worker, e.g. {missed[0]}"


def test_precompile_compiles_a_shared_alignment_kernel_once_per_process(monkeypatch):
    """Every moe_decode tactic of one BLOCK_M shares its alignment kernels: compiled for the first,
    skipped for the next (the GEMM, whose figure precompile returns, always compiles)."""
    from autotune.tactics.triton_fp4 import family as F
    names = []
    monkeypatch.setattr(F, "_PRECOMPILED", set())
    monkeypatch.setattr(F, "compile_kernel", lambda src, options, arch, stop_at: names.append(src.fn.__name__)
                        or type("CK", (), {"metadata": type("M", (), {"shared": 7})})())
    fam, sm90 = TritonFamily(), get_arch("sm90")
    p = PROBLEMS[1]            # w13:swiglu e256:top8
    ts = [t for t in fam.enumerate(p, sm90) if t["kernel"] == "moe_decode" and t["route"] == "aligned"
          and t["block_m"] == 16 and fam.verdict(p, t, sm90).ok][:2]
    assert len(ts) == 2
    assert fam.precompile(p, ts[0], sm90) == 7 and names == ["_moe_count_kernel"] + ["_moe_scatter_kernel"] * 4 + \
        ["moe_decode_kernel"]
    names.clear()
    assert fam.precompile(p, ts[1], sm90) == 7 and names == ["moe_decode_kernel"]
