"""The `triton` family: space, verdicts, and interpreter correctness of the W4A16 kernel."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.core.problem import Problem
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import Family
from autotune.tactics.triton_fp4 import TritonFamily, smem_bytes

ROOT = Path(__file__).resolve().parents[1]
FAM = TritonFamily()
P_NV = Problem.dense(4096, 4096, "nvfp4")
P_MX = Problem.dense(4096, 4096, "mxfp4")


def test_protocol_and_identity():
    assert isinstance(FAM, Family)
    assert FAM.name == "triton" and FAM.depends_on == ("triton",)
    from autotune.tactics.triton_fp4.family import MEMBERS, member_of
    from autotune.tactics.triton_fp4.member import Member
    assert [m.kernel for m in MEMBERS] == ["w4a16_dequant", "dequant_cublas", "moe_w4a16", "moe_decode",
                                            "w4a4_dot_scaled"]
    for m in MEMBERS:
        assert isinstance(m, Member) and member_of(m.kernel) is m and m.schema["kernel"] == (m.kernel,)


def test_available():
    ok, why = FAM.available("cpu")
    assert not ok and why == "no CUDA GPU: Triton kernels need one (TRITON_INTERPRET=1 runs them only for tests)"
    ok, why = FAM.available("cuda")
    assert ok and why == ""


def test_enumeration_deterministic_ids_stable_json_roundtrip():
    a = list(FAM.enumerate(P_NV, get_arch("sm90")))
    b = list(FAM.enumerate(P_NV, get_arch("sm90")))
    assert a == b and [t.id for t in a] == [t.id for t in b]
    assert 100 <= len(a) <= 1000
    assert len({t.id for t in a}) == len(a)
    kinds = {t["kernel"] for t in a}
    assert kinds == {"w4a16_dequant", "dequant_cublas"}
    assert {t["split_k"] for t in a if t["kernel"] == "w4a16_dequant"} == {1, 2, 4, 8, 16}
    # split-K only on small row tiles, which is where it pays (decode)
    assert all(t["block_m"] <= 32 for t in a if t.get("split_k", 1) > 1)
    for t in a:
        assert t.family == "triton"
        assert FAM.validate(t) is None
        r = Tactic.from_json(t.to_json())
        assert r == t and r.id == t.id
        assert Tactic.from_json(json.loads(t.to_json())) == t
    # ids are hashes of the parameters, not positions
    t = Tactic("triton", kernel="w4a16_dequant", block_m=64, block_n=64, block_k=128, group_m=8,
               num_warps=4, num_stages=3, split_k=1)
    assert t.id == Tactic.from_json(t.to_json()).id and t in a and t == FAM.default(P_NV, get_arch("sm90"))
    assert t.id == "d088b4213cc71802", t.id           # ids are a pure function of the parameters
    mx = list(FAM.enumerate(P_MX, get_arch("sm90")))
    assert mx and all(t["block_k"] >= 128 for t in mx)


def test_other_problems_enumerate_nothing():
    for p in (Problem.dense(4096, 4096, "fp8"), Problem.dense(4096, 4096, "nvfp4", a_fmt="mxfp4"),
              Problem.dense(4096, 4096, "bf16")):
        assert list(FAM.enumerate(p, get_arch("sm90"))) == []
        assert FAM.verdict(p, FAM.default(P_NV, get_arch("sm90")), get_arch("sm90")).rejected
    # a W4A4 problem gets only the W4A4 member (test_triton_w4a4.py), never a W4A16 kernel
    w4a4 = Problem.dense(4096, 4096, "nvfp4", a_fmt="nvfp4")
    assert {t["kernel"] for t in FAM.enumerate(w4a4, get_arch("sm90"))} == {"w4a4_dot_scaled"}
    assert FAM.verdict(w4a4, FAM.default(P_NV, get_arch("sm90")), get_arch("sm90")).rejected


def test_moe_member_space_and_kind_checks():
    moe = Problem.moe(1024, 1024, 8, 2, "nvfp4")
    every = list(FAM.enumerate(moe, get_arch("sm90")))
    assert {t["kernel"] for t in every} == {"moe_w4a16", "moe_decode"}     # moe_decode: test_moe_decode.py
    ts = [t for t in every if t["kernel"] == "moe_w4a16"]
    assert len(ts) == 36
    bad = [FAM.verdict(moe, t, get_arch("sm90")) for t in ts if not FAM.verdict(moe, t, get_arch("sm90")).ok]
    assert [v.reason for v in bad] == ["smem 251904 > 232448"]      # 64×128×256, 4 stages
    d = FAM.default(moe, get_arch("sm90"))
    assert d in ts and FAM.validate(d) is None
    # a dense kernel never runs a MoE problem and the MoE kernel never a dense one
    v = FAM.verdict(moe, FAM.default(P_NV, get_arch("sm90")), get_arch("sm90"))
    assert v.rejected and v.reason == "triton kernel w4a16_dequant does not run grouped_moe problems"
    assert FAM.verdict(P_NV, d, get_arch("sm90")).reason == "triton kernel moe_w4a16 does not run dense problems"
    with pytest.raises(ValueError, match="does not run dense"):
        FAM.build(P_NV, d, "cpu")


def test_validate():
    good = FAM.default(P_NV, get_arch("sm90"))
    assert FAM.validate(good) is None
    p = good.params
    assert FAM.validate(Tactic("triton", {**p, "block_m": 48})) is not None
    assert FAM.validate(Tactic("triton", {**p, "kernel": "nope"})) is not None
    assert FAM.validate(Tactic("triton", {**p, "extra": 1})) is not None
    assert FAM.validate(Tactic("triton", {k: v for k, v in p.items() if k != "group_m"})) is not None
    assert FAM.validate(Tactic("triton", {**p, "num_warps": 3})) is not None
    assert FAM.validate(Tactic("triton", {**p, "split_k": 3})) is not None
    assert FAM.validate(Tactic("cutlass", p)) is not None
    dq = Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256, num_warps=4)
    assert FAM.validate(dq) is None
    assert "exactly the parameters" in FAM.validate(Tactic("triton", {**dq.params, "split_k": 1}))


def test_verdict_rejects_with_reasons():
    sm90 = get_arch("sm90")
    t = FAM.default(P_NV, sm90)
    v = FAM.verdict(Problem.dense(4096, 4096 + 64, "nvfp4"), Tactic("triton", {**t.params, "block_k": 128}), sm90)
    assert v.rejected and "BLOCK_K=128 does not divide K=4160" in v.reason
    v = FAM.verdict(P_MX, Tactic("triton", {**t.params, "block_k": 64}), sm90)
    assert v.rejected and "BLOCK_K=64" in v.reason
    v = FAM.verdict(P_NV, Tactic("triton", {**t.params, "num_stages": 1}), sm90)
    assert v.rejected and v.reason
    v = FAM.verdict(Problem.dense(4096, 512, "nvfp4"), Tactic("triton", {**t.params, "block_m": 16, "split_k": 4}), sm90)
    assert v.rejected and v.reason == "split_k=4 leaves < 2 of the K/BLOCK_K=4 steps per split"
    big = Tactic("triton", kernel="w4a16_dequant", block_m=128, block_n=256, block_k=128, group_m=8,
                 num_warps=8, num_stages=5, split_k=1)
    v = FAM.verdict(P_NV, big, sm90)
    need = smem_bytes(big.params, "nvfp4", sm90)
    assert v.rejected and v.reason == f"smem {need} > 232448" and (v.smem_bytes, v.smem_limit) == (need, 232448)


def test_compat_table_rejects_known_failures_by_version():
    """A (kernel, Triton version, arch, format) that is known not to compile is rejected with a
    reason; other versions, archs and formats are not."""
    from autotune.tactics.triton_fp4 import compat
    sm90, sm120 = get_arch("sm90"), get_arch("sm120")
    why = compat.rejection("dot_scaled", "nvfp4", sm90, (3, 6))
    assert why and "does not compile on sm90 with Triton < 3.7" in why and "(installed 3.6)" in why
    assert compat.rejection("dot_scaled", "nvfp4", sm90, (3, 9)) is None
    assert compat.rejection("dot_scaled", "mxfp4", sm90, (3, 6)) is None
    assert compat.rejection("dot_scaled", "nvfp4", sm120, (3, 6)) is None
    assert compat.rejection("w4a16_dequant", "nvfp4", sm90, (3, 6)) is None


def test_dequant_cublas_member_verdict():
    dq = Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256, num_warps=4)
    assert FAM.verdict(P_NV, dq, get_arch("sm90")).ok
    v = FAM.verdict(Problem.dense(4096, 4096 + 128, "nvfp4"), dq, get_arch("sm90"))
    assert v.rejected and "BLOCK_K=256 does not divide K=4224" in v.reason
    assert FAM.verdict(P_NV, dq, ARCHS["cpu"]).ok          # interpreter pseudo-arch


def test_default_fits_every_arch():
    for p in (P_NV, P_MX, Problem.dense(256, 192, "nvfp4"), Problem.dense(512, 384, "mxfp4")):
        for arch in ARCHS.values():
            t = FAM.default(p, arch)
            v = FAM.verdict(p, t, arch)
            assert v.ok, (p, arch.name, v)


def test_verdict_never_compiles():
    """verdict() compiles nothing: judging every tactic on every arch never imports Triton (no wall-clock
    assertion: the CI machine is busy)."""
    code = textwrap.dedent("""
        import sys
        from autotune.core.problem import Problem
        from autotune.core.arch import ARCHS
        from autotune.tactics.triton_fp4.family import TritonFamily
        f = TritonFamily(); n = 0
        for fmt in ("nvfp4", "mxfp4"):
            p = Problem.dense(4096, 4096, fmt)
            for a in ARCHS.values():
                for t in f.enumerate(p, a):
                    f.verdict(p, t, a); n += 1
        assert "triton" not in sys.modules, sorted(m for m in sys.modules if m.startswith("triton"))
        print(n)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[0]) > 1000


_INTERP = textwrap.dedent("""
    import json, sys, torch
    from autotune.core.problem import Problem
    from autotune.tactics.triton_fp4.args import pack_u8
    from autotune.tactics.triton_fp4.family import TritonFamily
    from autotune.core.tactic import Tactic
    try:
        from autotune.core.formats import quantize
    except ImportError:
        quantize = None

    E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)

    def make_weight(w, fmt):
        if quantize is not None:
            return quantize(w, fmt)
        raise SystemExit("no quantize")

    def ref_dequant(q, fmt):
        # independent float64 decode: low nibble = even element
        p = q.packed.to(torch.int64)
        codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
        vals = E2M1[codes]
        if fmt == "nvfp4":
            s = q.scales.view(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
        else:
            s = torch.pow(2.0, q.scales.to(torch.float64) - 127)
        g = 16 if fmt == "nvfp4" else 32
        vals = (vals.view(p.shape[0], -1, g) * s[..., None]).reshape(p.shape[0], -1)
        return vals * q.global_scale.to(torch.float64)

    torch.manual_seed(0)
    out = []
    for fmt, m, n, k, cfgs in json.loads(sys.argv[1]):
        w = torch.randn(n, k) * 0.02
        q = make_weight(w, fmt)
        x = torch.randn(m, k).to(torch.bfloat16)
        ref = x.to(torch.float64) @ ref_dequant(q, fmt).T
        prob = Problem.dense(n, k, fmt)
        fam = TritonFamily()
        for bm, bn, bk, gm, sk in cfgs:
            if bm == 0:       # the dequant-then-matmul member
                t = Tactic("triton", kernel="dequant_cublas", block_n=bn, block_k=bk, num_warps=4)
            else:
                t = Tactic("triton", kernel="w4a16_dequant", block_m=bm, block_n=bn, block_k=bk, group_m=gm,
                           num_warps=4, num_stages=2, split_k=sk)
            assert fam.verdict(prob, t, __import__("autotune.core.arch", fromlist=["x"]).ARCHS["cpu"]).ok
            kern = fam.build(prob, t, "cpu")
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
            r = kern(x, q, out=y)
            assert r is y
            nan = int(torch.isnan(y).sum())
            err = float(torch.linalg.norm(y.to(torch.float64) - ref) / torch.linalg.norm(ref))
            y2 = kern(x, q)
            same = bool(torch.equal(y, y2)) and bool(torch.equal(y, kern(x, pack_u8(q))))   # U8 layout too
            # split-K counters must be back to zero after every launch
            locks = int(kern._locks.abs().sum()) if getattr(kern, "_locks", None) is not None else 0
            out.append([fmt, m, n, k, bm, bn, bk, gm, sk, nan, err, same, locks])
    print(json.dumps(out))
""")


def _triton_minor() -> tuple[int, int]:
    import triton
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


# Checked with Triton 3.9.0's interpreter (CI). On the H200's Triton 3.6.0 these two fail (cause not
# yet investigated); the compiled kernel is checked there by tests/test_gpu.py instead.
@pytest.mark.skipif(_triton_minor() < (3, 9), reason="interpreter checks are validated on Triton >= 3.9")
@pytest.mark.parametrize("fmt,m,n,k,cfgs", [
    ("nvfp4", 37, 96, 512, [[16, 32, 64, 1, 1], [32, 64, 128, 8, 1], [16, 32, 128, 1, 2], [0, 32, 128, 0, 0]]),
    ("mxfp4", 21, 64, 512, [[16, 32, 128, 8, 1], [32, 64, 256, 1, 1], [16, 64, 128, 1, 2]]),
])
def test_interpreter_matches_float64_reference(fmt, m, n, k, cfgs):
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP, json.dumps([[fmt, m, n, k, cfgs]])], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == len(cfgs)
    for fmt_, m_, n_, k_, bm, bn, bk, gm, sk, nan, err, same, locks in rows:
        assert bm == 0 or m_ % bm != 0 or n_ % bn != 0, "the sample must exercise masking"
        assert locks == 0, f"{bm}x{bn}x{bk} split {sk}: split-K counters left non-zero"
        assert nan == 0, f"{fmt_} {bm}x{bn}x{bk}: {nan} outputs not written"
        assert err < 1e-2, f"{fmt_} {bm}x{bn}x{bk}: rel. Frobenius error {err}"
        assert same


_MOE_INTERP = textwrap.dedent("""
    import json, sys, torch
    from autotune.core import inputs
    from autotune.core.problem import Problem
    from autotune.core.arch import ARCHS
    from autotune.core.tactic import Tactic
    from autotune.tactics.triton_fp4.args import pack_u8
    from autotune.tactics.triton_fp4.family import TritonFamily
    fam, out = TritonFamily(), []
    for fmt, m, n, k, e, top_k, cfgs in json.loads(sys.argv[1]):
        p = Problem.moe(n, k, e, top_k, fmt)
        s = inputs.make_inputs(p, m, "cpu", seed=5, skew=1.2)[0]       # skewed top-k routing
        ref = inputs.reference(p, s)
        for bm, bn, bk in cfgs:
            t = Tactic("triton", kernel="moe_w4a16", block_m=bm, block_n=bn, block_k=bk, num_warps=4, num_stages=2)
            assert fam.verdict(p, t, ARCHS["cpu"]).ok
            kern = fam.build(p, t, "cpu")
            err = inputs.check(p, kern, s, ref)                 # NaN-poisoned output, float64 reference
            # the family's prepacked layout gives the same bits
            assert torch.equal(kern(s.x, s.w, s.topk_ids, s.topk_weights),
                               kern(s.x, pack_u8(s.w), s.topk_ids, s.topk_weights))
            ids, _, npad, blocks = kern.align(s.topk_ids)
            out.append([fmt, bm, err, int(npad), blocks, int((ids < m * top_k).sum())])
    print(json.dumps(out))
""")


@pytest.mark.skipif(_triton_minor() < (3, 9), reason="interpreter checks are validated on Triton >= 3.9")
def test_moe_interpreter_matches_float64_reference():
    cases = [["nvfp4", 7, 48, 256, 6, 2, [[16, 32, 128], [32, 16, 256]]], ["mxfp4", 5, 32, 256, 4, 3, [[16, 32, 128]]]]
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _MOE_INTERP, json.dumps(cases)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == 3
    for fmt, bm, err, npad, blocks, live in rows:
        assert err < 1e-2, (fmt, bm, err)
        assert npad % bm == 0 and npad <= blocks * bm     # every expert's run padded to BLOCK_M
    assert rows[0][5] == 7 * 2 and rows[2][5] == 5 * 3    # every (token, slot) pair placed once


def test_outgrown_split_k_workspace_stays_alive_for_captured_graphs():
    # a CUDA graph captured at a small M keeps pointing at the first workspace after a larger M grows it
    import torch
    t = Tactic("triton", kernel="w4a16_dequant", block_m=16, block_n=32, block_k=128, group_m=1,
               num_warps=4, num_stages=2, split_k=4)
    launcher = FAM.build(Problem.dense(256, 1024), t, "cpu")
    small, _ = launcher._scratch(4, 2, torch.device("cpu"))
    big, _ = launcher._scratch(4, 64, torch.device("cpu"))
    assert big.numel() > small.numel() and any(ws is small for ws, _ in launcher._retired)


# ---- outside the region the smem model was checked on ------------------------------------

def test_outside_the_checked_region_is_unknown_without_a_compiler():
    """Never "fits" from an extrapolated rule: BLOCK_N=16 (buffer padding and scale scratch the
    model does not have), an sm8x epilogue outside its fit, a widened MoE grid: ok is None."""
    sm90, sm89 = get_arch("sm90"), get_arch("sm89")
    t = Tactic("triton", kernel="w4a16_dequant", block_m=64, block_n=16, block_k=64, group_m=1,
               num_warps=4, num_stages=6, split_k=1)
    v = FAM.verdict(P_NV, t, sm90)
    assert v.ok is None and v.reason.startswith("unknown: block_n=16 is outside") and v.smem_bytes is None
    assert v.stages == 6
    t256 = Tactic("triton", {**t.params, "block_m": 256, "block_n": 32, "num_stages": 3})
    v = FAM.verdict(P_NV, t256, sm89)
    assert v.ok is None and "sm8x epilogue" in v.reason
    assert FAM.verdict(P_NV, t256, sm90).ok          # BLOCK_M 256 is checked on sm90 (and sm100)
    moe = Problem.moe(1024, 1024, 8, 2, "nvfp4")
    m = Tactic("triton", kernel="moe_w4a16", block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3)
    v = FAM.verdict(moe, m, sm90)
    assert v.ok is None and "moe_w4a16" in v.reason
    # rules that reject still reject outside the region (K tiling before any smem question)
    v = FAM.verdict(Problem.dense(4096, 4096 + 64, "nvfp4"), Tactic("triton", {**t.params, "block_k": 128}), sm90)
    assert v.rejected and "does not divide" in v.reason
    # the cpu pseudo-arch has no smem limit: the interpreter runs any config
    assert FAM.verdict(P_NV, t, ARCHS["cpu"]).ok


def test_fallback_paths_and_tensor_memory_rules():
    """Below 4 warps (and at 16 on sm100) Triton uses mma.sync: no wgmma/tcgen05 buffers, no tensor
    memory; tcgen05 allocates at least 32 columns and 2·BN for BLOCK_M = 256 (Triton 3.9.0
    cross-compiles, tests/test_triton_crosscompile.py)."""
    from autotune.tactics.triton_fp4 import smem
    p = dict(block_m=64, block_n=64, block_k=128, group_m=1, num_warps=2, num_stages=3, split_k=1)
    assert smem.path(p, get_arch("sm90")) == smem.path(p, get_arch("sm100")) == "mma_v2"
    assert smem.tmem_columns(p, "nvfp4", get_arch("sm100")) == 0
    assert smem.smem_bytes(p, "nvfp4", get_arch("sm100")) == 41984
    assert smem.path({**p, "num_warps": 16}, get_arch("sm100")) == "mma_v2"
    assert smem.path({**p, "num_warps": 16}, get_arch("sm90")) == "wgmma"
    assert smem.tmem_columns({**p, "num_warps": 4, "block_n": 16}, "nvfp4", get_arch("sm100")) == 32
    assert smem.tmem_columns({**p, "num_warps": 4, "block_m": 256}, "nvfp4", get_arch("sm100")) == 128


class _WideTriton(TritonFamily):
    space_axes = {"w4a16_dequant": {"num_warps": (2, 4, 8), "block_n": (16, 32, 64, 128, 256)}}


def test_widened_space_keeps_ids_and_stays_safe():
    wide = _WideTriton()
    base = FAM.enumerate(P_NV, get_arch("sm90"))
    more = wide.enumerate(P_NV, get_arch("sm90"))
    assert set(base) < set(more) and {t.id for t in base} <= {t.id for t in more}
    assert {t["num_warps"] for t in more} == {2, 4, 8} and 16 in {t["block_n"] for t in more}
    sm90 = get_arch("sm90")
    vs = [wide.verdict(P_NV, t, sm90) for t in more if t not in set(base)]
    assert any(v.ok is None for v in vs) and any(v.ok for v in vs)
    assert all(v.reason.startswith("unknown: ") for v in vs if v.ok is None)
    # every unknown is a BLOCK_N=16 config here; every 2-warp one is modelled (mma.sync fallback)
    assert all(wide.verdict(P_NV, t, sm90).ok is not None for t in more if t["block_n"] >= 32)
    with pytest.raises(ValueError, match="num_warps=3 not in"):
        type("Bad", (TritonFamily,), {"space_axes": {"w4a16_dequant": {"num_warps": (3,)}}})()
    with pytest.raises(ValueError, match="no space axis 'split_k'"):
        type("Bad", (TritonFamily,), {"space_axes": {"w4a16_dequant": {"split_k": (2,)}}})()
    with pytest.raises(ValueError, match="unknown triton kernel"):
        type("Bad", (TritonFamily,), {"space_axes": {"nope": {}}})()


def test_validate_refuses_floats_for_ints():
    t = FAM.default(P_NV, get_arch("sm90"))
    assert "num_warps=4.0 not in" in FAM.validate(Tactic("triton", {**t.params, "num_warps": 4.0}))
    assert "group_m=True not in" in FAM.validate(Tactic("triton", {**t.params, "group_m": True}))


def _imports(path: Path, pkg: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in `path`, function-local ones included, relative ones resolved."""
    import ast
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = pkg.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module) if p)
            names = [a.name for a in node.names]
            if node.module is None:          # `from . import x` imports the modules package.x
                out += [(f"{mod}.{n}", []) for n in names]
            else:
                out.append((mod, names))
    return out


def test_family_layer_imports_only_core_and_base_without_cycles():
    """tactics/triton_fp4 imports autotune.core, autotune.tactics.base, autotune.tactics.scratch (the
    launchers' shared scratch pool, itself core + base only) and itself only, no private name of
    another module, has no import cycle (function-local imports counted) and no module of 500 lines."""
    pkg = "autotune.tactics.triton_fp4"
    files = sorted((ROOT / "tactics" / "triton_fp4").glob("*.py"))
    graph = {}
    for f in files:
        mod = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
        assert len(f.read_text().splitlines()) < 500, f
        deps = set()
        for target, names in _imports(f, pkg):
            top = target.split(".")[0]
            if top in ("autotune", "tactics", "cache", "cli", "tools"):
                assert (target.startswith(("autotune.core.", pkg))
                        or target in ("autotune.tactics.base", "autotune.tactics.scratch")), (f.name, target)
                assert not [n for n in names if n.startswith("_")], (f.name, target, names)
            if target.startswith(pkg):
                deps.add(target)
        graph[mod] = deps
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, "import cycle: " + " -> ".join(trail + [m])
        state[m] = 1
        for d in graph.get(m, ()):
            visit(d, trail + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])
    assert graph[pkg] == {f"{pkg}.family", f"{pkg}.smem"}
