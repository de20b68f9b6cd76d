"""moe_decode: space, verdicts, smem model vs Triton 3.9 cross-compiles, and the kernel against a
float64 dequantize-then-matmul reference under TRITON_INTERPRET=1 (small shapes)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.core.arch import ARCHS, get_arch
from autotune.core.problem import Problem
from autotune.tactics.triton_fp4 import moe_decode as md

ROOT = Path(__file__).resolve().parents[1]
W13 = Problem.moe(512, 6144, 256, 8, "nvfp4")       # GLM-5 TP8 routed w13
W2 = Problem.moe(6144, 256, 256, 8, "nvfp4")        # GLM-5 TP8 routed w2


def _cfg(**kw):
    base = dict(kernel="moe_decode", route="direct", block_m=16, block_n=64, block_k=128, split_k=1,
                num_warps=4, num_stages=3)
    return {**base, **kw}


def test_space_and_default():
    assert len(md.SPACE) == 168 and len({json.dumps(c, sort_keys=True) for c in md.SPACE}) == 168
    assert all(md.validate(c) is None for c in md.SPACE)
    sm90 = get_arch("sm90")
    kept13, kept2 = md.space(W13, sm90), md.space(W2, sm90)
    assert len(kept13) == 142 and len(kept2) == 47
    assert {c["split_k"] for c in kept2} == {1}      # K = 256: two 128-steps at most, nothing to split
    for p in (W13, W2):
        assert md.verdict(p, md.default(p), sm90).ok
    assert md.default(W13)["split_k"] == 8 and md.default(W13)["route"] == "direct"


def test_verdict_rejections():
    sm90, sm120 = get_arch("sm90"), get_arch("sm120")
    assert md.verdict(Problem.moe(512, 6144 + 128, 256, 8), _cfg(block_k=256), sm90).reason == \
        "BLOCK_K=256 does not divide K=6272 (the kernel does not mask K)"
    assert md.verdict(Problem.moe(48, 256, 4, 2), _cfg(block_n=32), sm90).reason == \
        "BLOCK_N=32 does not divide N=48 (the kernel does not mask N)"
    assert md.verdict(W2, _cfg(split_k=2), sm90).reason.startswith("split_k=2 leaves < 2 of the K/BLOCK_K=2 steps")
    mx = Problem.moe(512, 6144, 256, 8, "mxfp4")
    assert md.verdict(mx, _cfg(block_k=64), sm90).reason.startswith("BLOCK_K=64 < 128 for mxfp4")
    big = _cfg(route="aligned", block_m=64, block_n=128, block_k=256, num_stages=4)
    v90, v120 = md.verdict(W13, big, sm90), md.verdict(W13, big, sm120)
    assert v90.rejected and v90.reason == "smem 251904 > 232448"
    assert v120.rejected and v120.smem_bytes == 153600 and v120.smem_limit == 101376
    assert md.verdict(Problem.dense(512, 6144), _cfg(), sm90).reason.startswith("moe_decode runs grouped_moe")
    assert md.verdict(W13, {**_cfg(), "group_m": 1}, sm90).rejected
    assert md.verdict(W13, _cfg(route="sideways"), sm90).reason.startswith("route must be one of")
    assert md.verdict(W13, _cfg(), ARCHS["cpu"]).ok
    assert md.verdict(W13, _cfg(), get_arch("sm80")).ok


def test_make_launcher_refuses_bad_configs():
    with pytest.raises(ValueError, match="epilogue must be one of"):
        md.make_launcher(W13, _cfg(), "gelu")
    with pytest.raises(ValueError, match="must divide K=256 / N=48"):
        md.make_launcher(Problem.moe(48, 256, 4, 2), _cfg(block_n=32))
    with pytest.raises(ValueError, match="moe_decode runs grouped_moe"):
        md.make_launcher(Problem.dense(512, 6144), _cfg())


def test_x_must_have_the_rows_its_epilogue_reads():
    """reduce reads a row per (token, slot) [M, top_k, K], SwiGLU a row per token [M, K]: the other
    shape is refused in one line before anything runs (a 2-D x under reduce would give every slot
    the token's row and sum them, a plausible wrong answer)."""
    import torch
    from autotune.core import inputs
    p = Problem.moe(256, 256, 4, 2)
    w = inputs.seeded_weight(p, "cpu", 0)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    for epi, x in (("reduce", torch.zeros(3, 256)), ("swiglu", torch.zeros(3, 2, 256))):
        with pytest.raises(ValueError, match="x must be a bf16 .* tensor for " + re.escape(p.variant(epi).key)) as e:
            md.make_launcher(p.variant(epi), _cfg(), epi).check(x.to(torch.bfloat16), w, ids, None, None)
        assert "\n" not in str(e.value)


def _key(params) -> tuple:
    return tuple(sorted(params.items()))


def test_registered_in_the_triton_family():
    """The family enumerates the grid; its verdicts keep exactly md.space on the archs the smem model
    was checked on; moe_w4a16 stays the default; the bound launcher runs the MoE contract
    (tests/test_operands.py) and may be captured in a CUDA graph."""
    import torch
    from autotune.core.formats import quantize
    from autotune.core.tactic import Tactic
    from autotune.tactics.triton_fp4 import TritonFamily
    from autotune.tactics.triton_fp4.family import member_of
    fam = TritonFamily()
    for p in (W13, W2, Problem.moe(512, 6144, 256, 8, "mxfp4")):
        for arch in ("sm89", "sm90", "sm100", "sm120"):
            a = get_arch(arch)
            ts = [t for t in fam.enumerate(p, a) if t["kernel"] == "moe_decode"]
            assert all(fam.validate(t) is None for t in ts)
            assert {_key(t.params) for t in ts if fam.verdict(p, t, a).ok} == {_key(c) for c in md.space(p, a)}
    assert fam.default(W13, get_arch("sm90"))["kernel"] == "moe_w4a16"
    sm90 = get_arch("sm90")
    assert "route='sideways' not in" in fam.validate(Tactic("triton", _cfg(route="sideways")))
    assert "exactly the parameters" in fam.validate(Tactic("triton", {**_cfg(), "group_m": 1}))
    assert "split_k=3 not in" in fam.validate(Tactic("triton", _cfg(split_k=3)))
    # outside the checked grid or arch: unknown without a compiler figure, never an extrapolated fit
    v = fam.verdict(W13, Tactic("triton", _cfg(num_warps=8)), sm90)
    assert v.ok is None and v.reason.startswith("unknown: num_warps=8 is outside the grid")
    v = fam.verdict(W13, Tactic("triton", _cfg()), get_arch("sm80"))
    assert v.ok is None and "checked on sm89, sm90, sm100, sm120 only, not sm80" in v.reason
    wide = type("Wide", (TritonFamily,), {"space_axes": {"moe_decode": {"num_stages": (2, 3)}}})()
    assert {t["num_stages"] for t in wide.enumerate(W13, sm90) if t["kernel"] == "moe_decode"} == {2, 3}
    with pytest.raises(ValueError, match="no space axis 'route'"):
        type("Bad", (TritonFamily,), {"space_axes": {"moe_decode": {"route": ("direct",)}}})()
    # precompile: a direct config also compiles the aligned route it takes above 256 pairs
    m = member_of("moe_decode")
    assert len(m.sources("nvfp4", _cfg())) == 2 and len(m.sources("nvfp4", _cfg(route="aligned"))) == 1
    small = Problem.moe(64, 128, 4, 2)
    w = quantize(torch.randn(4, 64, 128))
    t = Tactic("triton", _cfg(block_n=32))
    launch = fam.bind(small, t, fam.pack(fam.layout(t), w), "cpu")
    assert launch.caps.capture_safe and type(fam.build(small, t, "cpu")) is md.MoEDecodeLauncher


def test_precompile_returns_the_compiled_figure():
    from autotune.core.tactic import Tactic
    from autotune.tactics.triton_fp4 import TritonFamily
    t = Tactic("triton", md.default(W13))
    assert TritonFamily().precompile(W13, t, get_arch("sm90")) == md.smem_bytes(t.params, "nvfp4", get_arch("sm90"))


# a sample of configs whose smem the model must equal exactly, on the two paths sm90 takes
# (mma.sync for 16/32 rows, wgmma at 64) and on sm120's 101 KB part; both epilogues
_SMEM_SAMPLE = [
    _cfg(),
    _cfg(block_n=128, block_k=256, split_k=8, num_stages=4),
    _cfg(route="aligned", block_m=32, block_n=32, block_k=256, split_k=4),
    _cfg(route="aligned", block_m=64, block_n=64, block_k=128, num_stages=4),
]


@pytest.mark.parametrize("arch", ["sm90", "sm120"])
def test_smem_model_equals_cross_compile(arch):
    for i, cfg in enumerate(_SMEM_SAMPLE):
        for epi in ("none", "swiglu"):
            if epi == "swiglu" and i % 2:
                continue        # SwiGLU changes no smem: checked on half the sample to stay fast
            got = md.cross_compile(W13, cfg, arch, epi)
            assert got == md.smem_bytes(cfg, "nvfp4", get_arch(arch)), (arch, cfg, epi, got)
    for cfg in (_SMEM_SAMPLE[0], _SMEM_SAMPLE[3]):       # the w2 form: weights applied, slots reduced
        got = md.cross_compile(W2, cfg, arch, "reduce")
        assert got == md.smem_bytes(cfg, "nvfp4", get_arch(arch)), (arch, cfg, "reduce", got)


_INTERP = textwrap.dedent("""
    import json, sys, torch
    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.core.problem import Problem
    from autotune.tactics.triton_fp4 import moe_decode as md
    from autotune.tactics.triton_fp4.moe_align import Aligner

    def reference(p, x, w, ids, tw, epi):
        wd = w.dequantize(torch.float64)
        m, k = ids.shape
        out = torch.zeros(m, k, p.n // (2 if epi == "swiglu" else 1), dtype=torch.float64)
        for t in range(m):
            for s in range(k):
                e = int(ids[t, s])
                if e < 0:
                    continue                                   # not on this rank: a zero row
                y = x[t].double() @ wd[e].T
                if epi == "swiglu":
                    g, u = y[: p.n // 2], y[p.n // 2:]
                    y = g * torch.sigmoid(g) * u
                out[t, s] = y * (float(tw[t, s]) if tw is not None else 1.0)
        return out.sum(1) if epi == "reduce" else out

    rows = []
    for fmt, m, n, k, e, top_k, route, bm, sk, epi, weighted in json.loads(sys.argv[1]):
        p = Problem.moe(n, k, e, top_k, fmt)
        s = inputs.make_inputs(p, m, "cpu", seed=m + sk)[0]
        ids = s.topk_ids.clone()
        ids[0, -1] = -1                                        # one slot routed off this rank
        if m > 2:
            ids[2, :] = ids[1, 0]                              # a token whose slots share one expert
        tw = s.topk_weights if weighted else None
        w = s.w
        if fmt == "nvfp4" and sk == 2:                         # one global scale per expert (ModelOpt [E])
            from autotune.core.formats import FP4Weight
            w = FP4Weight(w.packed, w.scales, torch.rand(e, generator=torch.Generator().manual_seed(e)) / 32 + 0.01, fmt)
        cfg = dict(kernel="moe_decode", route=route, block_m=bm, block_n=32, block_k=128, split_k=sk,
                   num_warps=4, num_stages=2)
        L = md.make_launcher(p, cfg, epi)
        shape = (m, L.n_out) if epi == "reduce" else (m, top_k, L.n_out)
        out = torch.full(shape, float("nan"), dtype=torch.bfloat16)
        L(s.x, w, ids, tw, out=out)
        ref = reference(p, s.x, w, ids, tw, epi)
        err = float((out.double() - ref).norm() / ref.norm())
        again = L(s.x, w, ids, tw)                           # counters reset: the same bits again
        locks = sum(int(c.abs().sum()) for c in L.counters())
        rows.append(dict(fmt=fmt, route=route, sk=sk, epi=epi, err=err, nan=int(torch.isnan(out).sum()),
                         zero_row=epi == "reduce" or bool((out[0, -1] == 0).all()), locks=locks,
                         same=bool(torch.equal(out, again))))
    # a shared alignment (one per layer) gives the aligned route the same answer
    p = Problem.moe(64, 256, 5, 2, "nvfp4")
    s = inputs.make_inputs(p, 6, "cpu", seed=9)[0]
    cfg = dict(kernel="moe_decode", route="aligned", block_m=16, block_n=32, block_k=128, split_k=1, num_warps=4,
               num_stages=2)
    L = md.make_launcher(p, cfg)
    a = Aligner(5, 16)(s.topk_ids)
    same = bool(torch.equal(L(s.x, s.w, s.topk_ids, aligned=a), L(s.x, s.w, s.topk_ids)))
    direct = md.make_launcher(p, dict(cfg, route="direct"), check_ids=True)     # the opt-in per-call raise
    same_direct = bool(torch.equal(direct(s.x, s.w, s.topk_ids), L(s.x, s.w, s.topk_ids)))
    # ids >= E are refused (and their rows are NaN, never a plausible value)
    bad = s.topk_ids.clone()
    bad[3, 1] = 5
    out = torch.zeros(6, 2, 64, dtype=torch.bfloat16)
    try:
        direct(s.x, s.w, bad, out=out)
        msg = None
    except ValueError as exc:
        msg = str(exc)
    nan_rows = int(torch.isnan(out).any(-1).sum())
    ok_after = bool(torch.isfinite(direct(s.x, s.w, s.topk_ids)).all())   # the flag was cleared
    quiet = md.make_launcher(p, dict(cfg, route="direct"))     # the default ($AUTOTUNE_CHECK_IDS unset)
    quiet(s.x, s.w, bad)                                       # no read, no raise: the caller reads the word
    quiet_flag = int(quiet.bad)
    # operand checks: one-line ValueErrors
    errs = []
    for args in [(s.x.float(), s.w, s.topk_ids), (s.x[:, :128], s.w, s.topk_ids), (s.x, s.w, s.topk_ids[:, :1]),
                 (s.x, s.w, s.topk_ids.float()), (s.x, s.w.expert(0), s.topk_ids)]:
        try:
            direct(*args)
            errs.append(None)
        except ValueError as exc:
            errs.append(str(exc))
    try:
        direct(s.x, s.w, s.topk_ids, out=torch.empty(6, 2, 32, dtype=torch.bfloat16))
    except ValueError as exc:
        errs.append(str(exc))
    print(json.dumps(dict(rows=rows, same=same, same_direct=same_direct, msg=msg, nan_rows=nan_rows,
                          ok_after=ok_after, errs=errs, quiet_flag=quiet_flag)))
""")

# fmt, M, N, K, E, top_k, route, BLOCK_M, SPLIT_K, epilogue, routing weights
_CASES = [
    ["nvfp4", 4, 64, 512, 6, 2, "direct", 16, 1, "none", False],
    ["nvfp4", 4, 64, 512, 6, 2, "direct", 16, 2, "swiglu", True],
    ["nvfp4", 5, 64, 512, 4, 3, "aligned", 16, 2, "none", True],
    ["mxfp4", 3, 64, 256, 5, 2, "aligned", 32, 1, "swiglu", False],
    ["mxfp4", 3, 32, 512, 3, 2, "direct", 16, 2, "none", False],
    ["nvfp4", 24, 32, 256, 3, 2, "direct", 16, 1, "none", True],     # > 16 pairs on one expert: 2 groups
    ["nvfp4", 4, 64, 512, 6, 3, "direct", 16, 2, "reduce", True],    # w2 form: weights applied, slots summed
    ["mxfp4", 20, 32, 256, 3, 2, "aligned", 16, 1, "reduce", False],
]


@pytest.fixture(scope="module")
def interp():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP, json.dumps(_CASES)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_interpreter_matches_float64(interp):
    assert len(interp["rows"]) == len(_CASES)
    for case, row in zip(_CASES, interp["rows"]):
        assert row["nan"] == 0, (case, row)                  # every element written
        assert row["err"] < 1e-2, (case, row)
        assert row["zero_row"], (case, row)                  # the -1 slot is a zero row
        assert row["locks"] == 0, (case, row)                # split-K / reduce counters left at zero
        assert row["same"], (case, row)                      # deterministic: a second call, the same bits


def test_shared_alignment_and_routes_agree(interp):
    assert interp["same"] and interp["same_direct"]


def test_bad_ids_refused(interp):
    assert interp["msg"] == "topk_ids holds expert ids outside [-1, E) (ids >= E or < -1 are refused)"
    assert interp["nan_rows"] == 1 and interp["ok_after"] and interp["quiet_flag"] == 1


def test_operand_checks(interp):
    errs = interp["errs"]
    assert all(e is not None and "\n" not in e for e in errs), errs
    assert errs[0].startswith("x must be a bf16 [M, 256] tensor")
    assert errs[1].startswith("x must be a bf16 [M, 256] tensor")
    assert errs[2].startswith("topk_ids must be int32/int64 [6, 2]")
    assert errs[3].startswith("topk_ids must be int32/int64 [6, 2]")
    assert errs[4].startswith("weight packed (64, 128)")
    assert errs[5] == "out must be a contiguous bf16 tensor of shape (6, 2, 64)"


