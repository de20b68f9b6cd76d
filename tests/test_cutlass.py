"""CUTLASS family: smem model vs the nvcc truth table, enumeration, FlashInfer mapping, messages."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.problem import Problem
from autotune.tactics import registry
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic
from autotune.tactics.cutlass import flashinfer_map as fim
from autotune.tactics.cutlass import smem as sm
from autotune.tactics.cutlass import truth
from autotune.tactics.cutlass.candidates import OPS, Kernel, all_kernels, offlist_neighbours, truth_extras
from autotune.tactics.cutlass.family import CutlassFamily, availability

ROOT = Path(__file__).resolve().parents[1]
TRUTH = truth.table()
ROWS = truth.rows()
KERNELS = {name: Kernel.from_smem_key(name) for name in ROWS}
FAM = CutlassFamily()
SM120, SM100 = get_arch("sm120"), get_arch("sm100")
DENSE = Problem.dense(4096, 6144)
MOE = Problem.moe(4096, 6144, 256, 8)


def K(**kw) -> Kernel:
    base = dict(kernel_arch="sm120", op="dense", tile_m=128, tile_n=128, tile_k=128, format="nvfp4",
                mma="mxf4nvf4", schedule="cooperative", scheduler="dp", epilogue_c="void", swap_ab=False)
    return Kernel(**{**base, **kw})


# ---- truth table --------------------------------------------------------------------------------

def test_truth_table_is_complete_and_for_the_modeled_cutlass():
    assert TRUTH["cutlass_version"] == sm.CUTLASS_VERSION
    assert TRUTH["flashinfer_version"] == fim.FLASHINFER_VERSION
    assert all(m["cutlass_version"] == sm.CUTLASS_VERSION for m in TRUTH.get("merges", []))
    assert not TRUTH["partial"], "regenerate: the table was written by an interrupted run"
    wanted = {k.smem_key for k in all_kernels() + truth_extras() + offlist_neighbours()}
    missing = sorted(wanted - set(ROWS))
    assert not missing, f"{len(missing)} candidates have no nvcc row, e.g. {missing[:3]}"
    assert len(offlist_neighbours()) == 22


#: rows the model declines (raises "not modeled" / "no epilogue model" instead of guessing; verdicts
#: use the rows themselves): the SM100 epilogue with a bf16 C picks its C/D stage counts from a tuned
#: table per tile (sm100_builder.inl ExpectedStagesC), and SM120 N = 96 compiles with 1 KiB more
#: mainloop storage than the arithmetic explains
NOT_MODELED = ("sm100/dense/nvfp4/mxf4nvf4/1sm/dp/cbf16/", "sm100/dense/nvfp4/mxf4nvf4/2sm/dp/cbf16/",
               "sm120/dense/nvfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x96x128",
               "sm120/dense/mxfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x96x128")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_model_matches_nvcc(name):
    row, k = ROWS[name], KERNELS[name]
    if row.get("compile_error"):
        assert sm.builder_rule(k), f"nvcc rejects it ({row['compile_error']}) but no builder rule does"
        return
    assert sm.builder_rule(k) is None, "a builder rule rejects a kernel nvcc compiles"
    if name.startswith(NOT_MODELED):
        with pytest.raises(ValueError, match="no epilogue model|not modeled"):
            sm.model(k)
        return
    m = sm.model(k)
    assert m.stages == row["stages"]
    assert m.epilogue_carveout == row["epi_smem"]
    assert m.kernel_bytes == row["kernel_smem"]          # None both sides below the minimum stages


def test_under_two_stages_is_a_compile_error_in_nvcc():
    checked = [r for r in TRUTH["rows"] if "full_compile_error" in r]
    assert checked, "gen.py --check-asserts recorded no full compile"
    for r in checked:
        assert "Stages set to value 2 or more" in r["full_compile_error"]


# ---- anchors (reference/cutlass-sm120.md) ---------------------------------------------------------

def test_mxfp4_128x128x128_lands_exactly_on_the_sm120_limit():
    k = K(format="mxfp4", epilogue_c="bf16")
    m = sm.model(k)
    assert (m.stages, m.kernel_bytes) == (5, 101_376) == (5, SM120.smem_per_block_optin)


@pytest.mark.parametrize("kw, stages", [
    (dict(tile_m=256, tile_k=256), 1),                                  # NVFP4 K=256 at 256x128
    (dict(tile_m=256, format="mxfp4", mma="mxf8f6f4"), 1),              # 8-bit smem path
    (dict(tile_n=256, format="mxfp4", mma="mxf8f6f4"), 1),
    (dict(tile_k=512), 1),                                              # TRT-LLM's pre-#12141 tile
])
def test_sm120_rejections(kw, stages):
    k = K(**kw)
    v = FAM.verdict(Problem.dense(4096, 6144, w_fmt=k.format), Tactic("cutlass", k.params()), SM120)
    assert v.rejected and v.stages == stages and "stage(s) < 2" in v.reason
    assert sm.model(k).stages == stages


def test_the_model_alone_never_rejects_or_keeps():
    """128x256x256 NVFP4: the model computes 1 stage (reference/cutlass-sm120.md saw nvcc assert on
    it with CUTLASS 4.7), but this table has no row for it, so the verdict stays unknown."""
    k = K(tile_n=256, tile_k=256)
    assert sm.model(k).stages == 1 and k.smem_key not in ROWS
    assert FAM.verdict(DENSE, Tactic("cutlass", k.params()), SM120).ok is None


def test_every_flashinfer_sm120_dense_tile_fits():
    for k in fim.SM120_DENSE:
        v = FAM.verdict(DENSE, Tactic("cutlass", k.params()), SM120)
        assert v.ok is True and v.smem_bytes <= 101_376, (k, v)


def test_grouped_moe_needs_more_than_dense():
    for m, n, kk in ((128, 128, 128), (128, 256, 128), (256, 128, 128)):
        dense = sm.model(K(tile_m=m, tile_n=n, tile_k=kk, epilogue_c="bf16"))
        moe = sm.model(K(tile_m=m, tile_n=n, tile_k=kk, epilogue_c="bf16", op="grouped_moe"))
        assert moe.capacity < dense.capacity
        assert dense.kernel_bytes is not None and moe.kernel_bytes is not None   # both modelled here
        assert moe.kernel_bytes > dense.kernel_bytes


def test_sm100_kernels_do_not_fit_sm120_and_vice_versa():
    t100 = Tactic("cutlass", fim.SM100_DENSE[0].params())
    t120 = Tactic("cutlass", fim.SM120_DENSE[0].params())
    assert "sm100 kernel on sm120" in FAM.verdict(DENSE, t100, SM120).reason
    assert "sm120 kernel on sm100" in FAM.verdict(DENSE, t120, SM100).reason
    assert FAM.verdict(DENSE, t100, SM100).ok is True


# ---- verdicts outside the lists: safe by construction ------------------------------------

TILE_N = (8, 16, 32, 48, 96, 128, 160, 192, 256)


def _validated_grid():
    """Every combination of the fields validate() accepts (the scheduler, which never changes shared
    memory, at both values only for the dense NVFP4 kernels), over tiles around the lists (N < 32,
    N not a multiple of 128, M 64..256, K 128..512): about 17k kernels."""
    import itertools
    for ka, op, fmt, mma, c, swap in itertools.product(
            ("sm120", "sm100"), ("dense", "grouped_moe"), ("nvfp4", "mxfp4", "mxfp8_mxfp4"), ("mxf4nvf4", "mxf8f6f4"),
            ("void", "bf16"), (False, True)):
        for sched in (("cooperative", "pingpong") if ka == "sm120" else ("1sm", "2sm")):
            for scheduler in (("dp", "streamk") if (op, fmt) == ("dense", "nvfp4") else ("dp",)):
                for m, n, k in itertools.product((64, 128, 256), TILE_N, (128, 256, 512)):
                    yield Kernel(ka, op, m, n, k, fmt, mma, sched, scheduler, c, swap,
                                 "2x1x1" if sched == "2sm" else "1x1x1")


def test_verdict_never_raises_and_never_says_fits_without_nvcc():
    arch = {"sm120": SM120, "sm100": SM100}
    problems = {(op, f): (Problem.moe(4096, 6144, 256, 8, w_fmt=f) if op == "grouped_moe" else
                          Problem.dense(4096, 6144, w_fmt=f)) for op in OPS for f in ("nvfp4", "mxfp4")}
    seen = {True: 0, False: 0, None: 0}
    for k in _validated_grid():
        t = Tactic("cutlass", k.params())
        assert FAM.validate(t) is None
        p = problems[k.op, "nvfp4" if k.format == "nvfp4" else "mxfp4"]
        v = FAM.verdict(p, t, arch[k.kernel_arch])        # must not raise
        seen[v.ok] += 1
        row = ROWS.get(k.smem_key)
        if v.ok is True:
            assert row and row["kernel_smem"] == v.smem_bytes <= v.smem_limit, k.smem_key
        elif v.ok is None:
            assert row is None and v.reason.startswith("unknown: ") and v.smem_bytes is None, (k.smem_key, v)
        elif row is not None and v.smem_bytes is not None:
            assert v.smem_bytes == row["kernel_smem"]        # a figure in a reason is nvcc's
    assert all(seen.values()), seen


@pytest.mark.parametrize("kernel", [
    K(epilogue_c="bf16", swap_ab=True),                                    # SM120 bf16 C with swap_ab
    K(format="mxfp4", epilogue_c="bf16", swap_ab=True),
    Kernel("sm100", "dense", 128, 64, 128, "nvfp4", "mxf4nvf4", "1sm", "dp", "bf16", False),   # SM100 bf16 C
    Kernel("sm100", "dense", 128, 16, 128, "nvfp4", "mxf4nvf4", "1sm", "dp", "void", False),   # SM100 N < 32
    Kernel("sm100", "dense", 128, 16, 128, "nvfp4", "mxf4nvf4", "2sm", "dp", "void", False, "2x1x1"),
], ids=lambda k: k.smem_key)
def test_validated_tactics_that_used_to_raise_get_nvccs_verdict(kernel):
    row = ROWS[kernel.smem_key]
    arch = SM120 if kernel.kernel_arch == "sm120" else SM100
    v = FAM.verdict(Problem.dense(4096, 6144, w_fmt=kernel.format), Tactic("cutlass", kernel.params()), arch)
    assert v.ok is False                                       # compiled, but FlashInfer does not build it
    if row["kernel_smem"] is not None:
        assert (v.smem_bytes, v.stages) == (row["kernel_smem"], row["stages"])
        assert "mm_fp4 does not build it" in v.reason


@pytest.mark.parametrize("key, message", [
    ("sm120/dense/mxfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x192x128", "Shape Divisibility Condition"),
    ("sm120/dense/nvfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x160x128", "Shape Divisibility Condition"),
    ("sm120/dense/nvfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x192x128", "Shape Divisibility Condition"),
    ("sm120/dense/nvfp4/mxf4nvf4/cooperative/dp/cvoid/noswap/128x48x128", "Divisibility Condition"),
    ("sm100/dense/nvfp4/mxf4nvf4/1sm/dp/cvoid/noswap/128x96x128", "Invalid TileShape_N."),
    ("sm100/dense/nvfp4/mxf4nvf4/1sm/dp/cvoid/noswap/128x16x128", "Invalid TileShape_N."),
])
def test_kernels_nvcc_refuses_are_rejected_with_its_message(key, message):
    """The model's arithmetic alone said these fit; nvcc 13.0 with CUTLASS 4.5.0 refuses them."""
    k = Kernel.from_smem_key(key)
    assert message in ROWS[key]["compile_error"]
    v = FAM.verdict(Problem.dense(4096, 6144, w_fmt=k.format), Tactic("cutlass", k.params()),
                    SM120 if k.kernel_arch == "sm120" else SM100)
    assert v.ok is False and message in v.reason and "fits" not in v.reason


@pytest.mark.parametrize("key", ["sm100/dense/nvfp4/mxf4nvf4/1sm/dp/cvoid/noswap/128x192x128",
                                 "sm100/dense/nvfp4/mxf4nvf4/2sm/dp/cvoid/noswap/128x192x128"])
def test_sm100_sfb_tile_rounds_n_up_to_a_multiple_of_128(key):
    """SFB is moved as if N were 256 at N = 192 (MMA_N_SFB); max(N, 128) under-counted 6 KiB."""
    k, row = Kernel.from_smem_key(key), ROWS[key]
    assert sm.sfb_tile_n(k) == 256
    m = sm.model(k)
    assert (m.stages, m.kernel_bytes) == (row["stages"], row["kernel_smem"])


@pytest.mark.parametrize("kernel", [
    K(tile_n=96, tile_k=256),                                              # never compiled
    K(tile_n=64, tile_k=512),
    K(schedule="pingpong", tile_m=64),
    Kernel("sm100", "dense", 128, 256, 256, "nvfp4", "mxf4nvf4", "1sm", "dp", "bf16", False),
    K(op="grouped_moe", tile_n=96, epilogue_c="bf16"),
], ids=lambda k: k.smem_key)
def test_kernel_without_an_nvcc_row_is_unknown_whatever_the_model_says(kernel):
    assert kernel.smem_key not in ROWS
    arch = SM120 if kernel.kernel_arch == "sm120" else SM100
    p = MOE if kernel.op == "grouped_moe" else DENSE
    v = FAM.verdict(p, Tactic("cutlass", kernel.params()), arch)
    assert v.ok is None and v.reason.startswith("unknown: ") and "never compiled" in v.reason
    assert v.smem_bytes is None and v.stages is None


# ---- enumeration --------------------------------------------------------------------------------

def test_enumeration_counts_and_every_tactic_has_a_verdict():
    assert len(FAM.enumerate(DENSE, SM120)) == 40          # FlashInfer's 32 + TRT-LLM's 2 extra tiles x 4
    assert len(FAM.enumerate(DENSE, SM100)) == 32
    assert len(FAM.enumerate(MOE, SM120)) == 16
    assert len(FAM.enumerate(MOE, SM100)) == 6               # TRT-LLM's 3 FP4 tiles x 1-SM/2-SM
    assert FAM.enumerate(DENSE, get_arch("sm90")) == [] == FAM.enumerate(DENSE, ARCHS["cpu"])
    for p, a in ((DENSE, SM120), (DENSE, SM100), (MOE, SM120), (MOE, SM100),
                 (Problem.dense(4096, 6144, w_fmt="mxfp4"), SM120)):
        for t in FAM.enumerate(p, a):
            assert FAM.validate(t) is None
            v = FAM.verdict(p, t, a)
            assert v.ok is not None
            assert v.ok or v.reason
            assert Tactic.from_json(t.to_json()) == t


def test_mxfp4_dense_on_sm120_is_modeled_but_not_run_through_flashinfer():
    p = Problem.dense(4096, 6144, w_fmt="mxfp4")
    vs = [FAM.verdict(p, t, SM120) for t in FAM.enumerate(p, SM120)]
    assert not any(v.ok for v in vs)
    assert any("mm_fp4 does not build it" in v.reason for v in vs)


def test_default_is_kept():
    for p, a in ((DENSE, SM120), (DENSE, SM100)):
        assert FAM.verdict(p, FAM.default(p, a), a).ok is True


# ---- FlashInfer integer tactic <-> our kernels ----------------------------------------------------

def test_flashinfer_index_round_trip():
    for arch, n in (("sm120", 32), ("sm100", 32)):
        cs = fim.configs(arch)
        assert len(cs) == n == len(set(cs))
        for i, k in enumerate(cs):
            assert fim.to_index(k) == i and fim.from_index(arch, i) == k


def test_flashinfer_order_and_k_units():
    # getConfigs() pushes (swap, DP), (no swap, DP), (swap, stream-K), (no swap, stream-K) per tile
    k0, k1, k2 = fim.from_index("sm120", 0), fim.from_index("sm120", 1), fim.from_index("sm120", 2)
    assert (k0.swap_ab, k0.scheduler, k1.swap_ab, k2.scheduler) == (True, "dp", False, "streamk")
    assert (k0.tile_m, k0.tile_n, k0.tile_k) == (128, 32, 128) and fim.enum_name(k0) == "CtaShape128x32x64B"
    k = fim.from_index("sm120", 4 * 5)                       # CtaShape128x128x128B: K 256 elements
    assert (k.tile_n, k.tile_k, fim.enum_name(k)) == (128, 256, "CtaShape128x128x128B")
    assert fim.from_index("sm120", -1) == K()
    first = fim.from_index("sm100", 0)                       # best-first index 22 = tile 2, cluster 6
    assert (first.tile_n, first.tile_k, first.cluster, first.schedule) == (128, 256, "2x4x1", "2sm")
    for bad in (32, -2, True, 1.0):
        with pytest.raises(ValueError):
            fim.from_index("sm120", bad)


def test_tactic_json_stores_fields_not_an_index():
    t = Tactic("cutlass", fim.from_index("sm120", 7).params())
    d = json.loads(t.to_json())["params"]
    assert d["tile_k"] == 256 and "index" not in d and registry.validate("cutlass", d) is None


@pytest.mark.parametrize("change, msg", [
    (dict(tile_k=100), "multiple of 8"), (dict(schedule="1sm"), "does not belong"),
    (dict(cluster="2x1x1"), "cluster 1x1x1"), (dict(mma="k64"), "mma='k64'"), (dict(swap_ab=1), "swap_ab must be bool"),
])
def test_validate_messages(change, msg):
    p = {**K().params(), **change}
    assert msg in FAM.validate(Tactic("cutlass", p))


# ---- availability: every message ------------------------------------------------------------------

V = fim.FLASHINFER_VERSION


@pytest.mark.parametrize("arch, fi, msg", [
    ("sm90", V, "SM90: no FP4 tensor cores"), ("sm89", V, "SM89: no FP4 tensor cores"),
    ("sm103", V, "SM103: FlashInfer builds a separate CUTLASS module"),
    ("sm120", None, "flashinfer is not installed"), ("sm100", None, "flashinfer is not installed"),
    ("sm120", "0.6.18", "flashinfer 0.6.18 is installed; this family maps the CUTLASS tactic list of " + V),
    ("sm121", V, ""), ("sm100", V + "+cu130", ""),
])
def test_availability_messages(arch, fi, msg):
    ok, why = availability(get_arch(arch), fi)
    assert ok == (msg == "") and (msg in why if msg else why == "")


def test_available_on_this_machine():
    ok, why = FAM.available("cpu")
    assert not ok and why.startswith("no CUDA GPU")
    import torch
    if not torch.cuda.is_available():
        assert FAM.available("cuda") == (False, why)


def test_build_refuses_without_a_device():
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        FAM.build(DENSE, FAM.default(DENSE, SM120), "cuda")


def test_dry_run_lists_every_cutlass_candidate():
    out = subprocess.run([sys.executable, "cli.py", "search", "--model", "glm5", "--arch", "sm120", "--dry-run",
                          "--families", "cutlass,cublaslt", "--list-tactics", "cutlass,cublaslt"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln.strip() for ln in out.stdout.splitlines()]
    cut = [ln for ln in lines if "cutlass[" in ln]
    assert len(cut) == 4 * 40 + 4 * 16     # 4 dense + 2 MoE GLM-5 problems + the 2 with the shared expert folded in
    assert all(ln.startswith(("kept", "REJECTED")) for ln in cut)
    assert all("smem" in ln for ln in cut if ln.startswith("kept"))
    assert all(": " in ln for ln in cut if ln.startswith("REJECTED"))
    assert any("unknown" in ln and "cublaslt[" in ln for ln in lines)


# ---- weight layout: swizzled once at load -----------------------------------------------

def _weight(n=200, k=256, fmt="nvfp4"):
    import torch
    from autotune.core.formats import quantize
    g = torch.Generator().manual_seed(0)
    return quantize(torch.randn(n, k, generator=g), fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_pack_swizzles_the_scales_once_and_unswizzle_restores_them(fmt):
    import torch
    from autotune.core.formats import swizzle_128x4, swizzled_size_128x4
    from autotune.runtime.bound import extra_bytes
    w = _weight(fmt=fmt)                                       # N = 200: padded rows in the 128x4 layout
    t = FAM.default(DENSE, SM120)
    assert FAM.layout(t) == "swizzled-128x4"
    sw = FAM.pack(FAM.layout(t), w)
    assert sw.packed.data_ptr() == w.packed.data_ptr()         # the codes are the source's own bytes
    assert sw.scales.dtype == torch.uint8 and sw.scales.numel() == swizzled_size_128x4(200, 256 // w.block)
    assert torch.equal(sw.scales, swizzle_128x4(w.scales))
    back = sw.linear_scales()
    assert back.dtype == w.scales.dtype and torch.equal(back.view(torch.uint8), w.scales.view(torch.uint8))
    assert extra_bytes(w, [sw]) == sw.scales.numel()  # only the swizzled scales are extra
    with pytest.raises(ValueError, match="no weight layout"):
        FAM.pack("fp4-linear-u8", w)


def test_flashinfer_weight_operands_are_views_of_the_packed_weight(swizzle_calls):
    import torch
    from autotune.core.formats import swizzle_128x4
    from autotune.tactics.cutlass.family import WeightOperands
    p = Problem.dense(200, 256)
    w = _weight()
    sw = FAM.pack("swizzled-128x4", w)
    swizzle_calls.clear()
    ops = WeightOperands(p)
    first = ops(sw)
    for _ in range(5):
        b, sf, in_scale, w_scale, gs, alpha = ops(sw)
    assert swizzle_calls == []                                 # packed form: never swizzled per call
    assert gs is first.gs and alpha is first.alpha             # device scalars made once per weight, not per call
    assert float(gs) == 1.0 and float(alpha) == float(w.global_scale) and gs.device == w.packed.device
    assert b.shape == (128, 200) and b.data_ptr() == w.packed.data_ptr()
    assert sf.data_ptr() == sw.scales.data_ptr()
    # what the launcher used to compute on each call, byte for byte
    assert torch.equal(sf, swizzle_128x4(w.scales).reshape(-1, 16).T)
    assert (in_scale, w_scale) == (1.0, float(w.global_scale))


def test_flashinfer_weight_operands_swizzle_a_plain_weight_once(swizzle_calls):
    from autotune.tactics.cutlass.family import WeightOperands
    ops, w = WeightOperands(Problem.dense(200, 256)), _weight()
    for _ in range(5):
        ops(w)
    assert swizzle_calls == [(200, 16)]                        # once for this weight object
    ops(_weight())
    assert len(swizzle_calls) == 2                             # a new weight object: once more


def test_weight_that_does_not_match_the_problem_is_refused():
    from autotune.tactics.cutlass.family import WeightOperands
    sw = FAM.pack("swizzled-128x4", _weight(n=64))
    with pytest.raises(ValueError, match=r"weight packed 64x128 does not match the problem's 200x128"):
        WeightOperands(Problem.dense(200, 256))(sw)
    with pytest.raises(ValueError, match="weight packed 64x128 does not match"):
        FAM.bind(Problem.dense(200, 256), FAM.default(DENSE, SM120), sw, "cuda")
    with pytest.raises(ValueError, match="weight format is mxfp4, the problem's is nvfp4"):
        FAM.bind(Problem.dense(200, 256), FAM.default(DENSE, SM120), FAM.pack("swizzled-128x4", _weight(fmt="mxfp4")),
                 "cuda")
    with pytest.raises(TypeError, match="swizzled-128x4 packed weight"):
        FAM.bind(Problem.dense(200, 256), FAM.default(DENSE, SM120), _weight(), "cuda")


def test_bind_without_a_device_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    p = Problem.dense(200, 256)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        FAM.bind(p, FAM.default(p, SM120), FAM.pack("swizzled-128x4", _weight()), "cuda")


def test_grouped_moe_kernels_are_judged_not_run():
    """The family has no grouped launcher (so no topk-id mapping to check): build refuses, on any
    machine, before looking for a device."""
    t = FAM.enumerate(MOE, SM120)[0]
    assert FAM.verdict(MOE, t, SM120).ok is not True
    with pytest.raises(RuntimeError, match="dense GEMMs only"):
        FAM.build(MOE, t, "cuda")


# ---- hardware ---------------------------------------------------------------------------------------

def _run_on_device():
    import torch
    from autotune.core.inputs import make_inputs, reference
    arch = "sm120" if torch.cuda.get_device_capability()[0] == 12 else "sm100"
    ok, why = FAM.available("cuda")
    if not ok:
        pytest.skip(why)
    s = make_inputs(DENSE, 256, "cuda", seed=0)[0]
    ref = reference(DENSE, s)
    for t in FAM.enumerate(DENSE, get_arch(arch)):
        if FAM.verdict(DENSE, t, get_arch(arch)).ok:
            y = FAM.build(DENSE, t, "cuda")(s.x, s.w).double()
            assert float((y - ref).norm() / ref.norm()) < 0.25     # W4A4: activations quantized too
            bound = FAM.bind(DENSE, t, FAM.pack(FAM.layout(t), s.w), "cuda")
            assert torch.equal(bound(s.x).double(), y)             # the packed form: same kernel, same bytes


@pytest.mark.gpu
@pytest.mark.requires_sm120
def test_flashinfer_cutlass_sm120_runs_every_kept_tactic():
    _run_on_device()


@pytest.mark.gpu
@pytest.mark.requires_sm100
def test_flashinfer_cutlass_sm100_runs_every_kept_tactic():
    _run_on_device()
