"""CUTLASS family: smem model vs the nvcc truth table, enumeration, FlashInfer mapping, messages."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.problem import Problem
from tactics import registry
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic
from tactics.cutlass import flashinfer_map as fim
from tactics.cutlass import smem as sm
from tactics.cutlass.candidates import Kernel, all_kernels, truth_extras
from tactics.cutlass.family import CutlassFamily, availability

ROOT = Path(__file__).resolve().parents[1]
TRUTH = json.loads((ROOT / "tests/data/cutlass_smem_truth.json").read_text())
ROWS = {r["name"]: r for r in TRUTH["rows"]}
KERNELS = {k.smem_key: k for k in all_kernels() + truth_extras()}
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
    assert not TRUTH["partial"], "regenerate: the table was written by an interrupted run"
    missing = sorted(set(KERNELS) - set(ROWS))
    assert not missing, f"{len(missing)} candidates have no nvcc row, e.g. {missing[:3]}"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_model_matches_nvcc(name):
    row, k = ROWS[name], KERNELS[name]
    if row.get("compile_error"):
        assert sm.builder_rule(k), f"nvcc rejects it ({row['compile_error']}) but no builder rule does"
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
    (dict(tile_n=256, tile_k=256), 1),
    (dict(tile_m=256, format="mxfp4", mma="mxf8f6f4"), 1),              # 8-bit smem path
    (dict(tile_n=256, format="mxfp4", mma="mxf8f6f4"), 1),
    (dict(tile_k=512), 1),                                              # TRT-LLM's pre-#12141 tile
])
def test_sm120_rejections(kw, stages):
    k = K(**kw)
    v = FAM.verdict(Problem.dense(4096, 6144, w_fmt=k.format), Tactic("cutlass", k.params()), SM120)
    assert v.rejected and v.stages == stages and "stage(s) < 2" in v.reason


def test_every_flashinfer_sm120_dense_tile_fits():
    for k in fim.SM120_DENSE:
        v = FAM.verdict(DENSE, Tactic("cutlass", k.params()), SM120)
        assert v.ok is True and v.smem_bytes <= 101_376, (k, v)


def test_grouped_moe_needs_more_than_dense():
    for m, n, kk in ((128, 128, 128), (128, 256, 128), (256, 128, 128)):
        dense = sm.model(K(tile_m=m, tile_n=n, tile_k=kk, epilogue_c="bf16"))
        moe = sm.model(K(tile_m=m, tile_n=n, tile_k=kk, epilogue_c="bf16", op="grouped_moe"))
        assert moe.capacity < dense.capacity
        assert moe.kernel_bytes is None or dense.kernel_bytes is None or moe.kernel_bytes >= dense.kernel_bytes


def test_sm100_kernels_do_not_fit_sm120_and_vice_versa():
    t100 = Tactic("cutlass", fim.SM100_DENSE[0].params())
    t120 = Tactic("cutlass", fim.SM120_DENSE[0].params())
    assert "sm100 kernel on sm120" in FAM.verdict(DENSE, t100, SM120).reason
    assert "sm120 kernel on sm100" in FAM.verdict(DENSE, t120, SM100).reason
    assert FAM.verdict(DENSE, t100, SM100).ok is True


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
    (dict(cluster="2x1x1"), "cluster 1x1x1"), (dict(mma="k64"), "mma='k64'"), (dict(swap_ab=1), "bool"),
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
    assert len(cut) == 4 * 40 + 2 * 16                       # 4 dense + 2 MoE GLM-5 problems
    assert all(ln.startswith(("kept", "REJECTED")) for ln in cut)
    assert all("smem" in ln for ln in cut if ln.startswith("kept"))
    assert all(": " in ln for ln in cut if ln.startswith("REJECTED"))
    assert any("unknown" in ln and "cublaslt[" in ln for ln in lines)


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


@pytest.mark.gpu
@pytest.mark.requires_sm120
def test_flashinfer_cutlass_sm120_runs_every_kept_tactic():
    _run_on_device()


@pytest.mark.gpu
@pytest.mark.requires_sm100
def test_flashinfer_cutlass_sm100_runs_every_kept_tactic():
    _run_on_device()
