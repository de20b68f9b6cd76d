"""The static smem model equals Triton's `metadata.shared` for a seeded sample, per target.

Cross-compiles (no GPU) with the LLVM-IR stop of compile.py (through family.cross_compile) into a fresh cache directory, so every
compile is real. Requires the Triton version the model was checked against (3.9).
"""
from __future__ import annotations

import random

import pytest

triton = pytest.importorskip("triton")
if not triton.__version__.startswith("3.9"):
    pytest.skip(f"smem model is checked against Triton 3.9, found {triton.__version__}", allow_module_level=True)

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.arch import get_arch  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402
from autotune.tactics.triton_fp4 import TritonFamily, smem_bytes  # noqa: E402
from autotune.tactics.triton_fp4.family import cross_compile as _compile  # noqa: E402


def cross_compile(fmt, params, arch, stop_at="llir", cache_dir=None):
    """(metadata.shared, ptx or None) of the member's kernel cross-compiled for `arch`."""
    ck = _compile(fmt, params, arch, stop_at=stop_at, cache_dir=cache_dir)
    return int(ck.metadata.shared), ck.asm.get("ptx") if stop_at == "cubin" else None

FAM = TritonFamily()
TARGETS = ("sm80", "sm89", "sm90", "sm100", "sm120")
PER_TARGET = 4            # per format → 8 configs per target


def _sample(fmt: str, arch: str) -> list[Tactic]:
    space = [t for t in FAM.enumerate(Problem.dense(4096, 4096, fmt), get_arch(arch)) if t["kernel"] == "w4a16_dequant"]
    return random.Random(f"{fmt}-{arch}-7").sample(space, PER_TARGET)


CASES = [(fmt, arch, t) for arch in TARGETS for fmt in ("nvfp4", "mxfp4") for t in _sample(fmt, arch)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("triton-cache"))


@pytest.mark.parametrize("fmt,arch,tactic", CASES, ids=[f"{a}-{f}-{t.id}" for f, a, t in CASES])
def test_model_equals_compiler(fmt, arch, tactic, cache):
    shared, _ = cross_compile(fmt, tactic.params, arch, cache_dir=cache)
    assert smem_bytes(tactic.params, fmt, get_arch(arch)) == shared, (arch, fmt, tactic.params)


def test_nvfp4_compiles_for_sm80_and_verdict_agrees(cache):
    """Scales are decoded from uint8 bits, so NVFP4 compiles on sm80/86 and the verdict keeps it."""
    t = FAM.default(Problem.dense(4096, 4096, "nvfp4"), get_arch("sm80"))
    for arch in ("sm80", "sm86"):
        shared, ptx = cross_compile("nvfp4", t.params, arch, stop_at="cubin", cache_dir=cache)
        assert ptx and "mma.sync" in ptx
        v = FAM.verdict(Problem.dense(4096, 4096, "nvfp4"), t, get_arch(arch))
        assert v.ok and v.smem_bytes == shared


def test_sm120_over_limit_rejected_with_numbers_fine_on_sm90(cache):
    p = Problem.dense(4096, 4096, "nvfp4")
    t = Tactic("triton", kernel="w4a16_dequant", block_m=64, block_n=128, block_k=128, group_m=8,
               num_warps=4, num_stages=5, split_k=1)
    need = smem_bytes(t.params, "nvfp4", get_arch("sm120"))
    shared, _ = cross_compile("nvfp4", t.params, "sm120", cache_dir=cache)
    assert shared == need > 101376
    v = FAM.verdict(p, t, get_arch("sm120"))
    assert v.rejected and v.reason == f"smem {need} > 101376"
    assert (v.smem_bytes, v.smem_limit) == (need, 101376)
    v90 = FAM.verdict(p, t, get_arch("sm90"))
    shared90, _ = cross_compile("nvfp4", t.params, "sm90", cache_dir=cache)
    assert v90.ok and v90.smem_bytes == shared90 <= 232448


def test_split_k_and_precompile_match_the_model(cache):
    """Split-K's epilogue (workspace, counters, atomics) adds no shared memory on the mma.sync path,
    and precompile() — what the search runs ahead of timing — returns the compiler's figure."""
    p = Problem.dense(4096, 4096, "nvfp4")
    t = Tactic("triton", kernel="w4a16_dequant", block_m=16, block_n=64, block_k=256, group_m=1,
               num_warps=4, num_stages=3, split_k=8)
    shared, ptx = cross_compile("nvfp4", t.params, "sm90", stop_at="cubin", cache_dir=cache)
    assert shared == smem_bytes(t.params, "nvfp4", get_arch("sm90")) == FAM.verdict(p, t, get_arch("sm90")).smem_bytes
    # the e2m1 decode is the inline PTX block, the split-K handshake an acq_rel atomic
    assert "prmt.b32" in ptx and "fma.rn.bf16x2" in ptx and "atom.global.gpu.acq_rel.add" in ptx
    from triton import knobs
    old = knobs.cache.dir
    knobs.cache.dir = cache
    try:
        assert FAM.precompile(p, t, get_arch("sm90")) == shared
    finally:
        knobs.cache.dir = old


def test_moe_kernel_model_equals_compiler(cache):
    """The grouped-MoE kernel shares the dense main loop: the same smem rule holds."""
    for arch, fmt in (("sm90", "nvfp4"), ("sm100", "mxfp4")):
        t = Tactic("triton", kernel="moe_w4a16", block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4)
        shared, _ = cross_compile(fmt, t.params, arch, cache_dir=cache)
        assert shared == smem_bytes(t.params, fmt, get_arch(arch)), (arch, fmt)


def test_sm8x_epilogue_set_is_the_compilers():
    """Where the sm8x epilogue (not the pipeline) sets the total is re-derived by cross-compiling
    every (BM, BN, warps) of the fitted domain; it must be exactly the model's set."""
    from autotune.tactics.triton_fp4.smem import SM8X_FULL_TILE_EPILOGUE
    from tools.triton_smem.fit_epilogue import fit_epilogue
    assert fit_epilogue("sm89", jobs=2) == SM8X_FULL_TILE_EPILOGUE


# configs of the default space whose figure the whole-tile epilogue rule over-estimated on sm89
# (docs/triton-smem-table.md, 2026-11-29), and the MXFP4 form on sm80
@pytest.mark.parametrize("fmt,arch,bm,bn,bk,warps,stages", [
    ("nvfp4", "sm89", 32, 256, 64, 4, 2), ("nvfp4", "sm89", 64, 256, 64, 8, 2),
    ("nvfp4", "sm89", 128, 256, 64, 8, 3), ("nvfp4", "sm89", 128, 256, 128, 8, 2),
    ("nvfp4", "sm89", 128, 128, 64, 4, 2), ("mxfp4", "sm80", 128, 256, 128, 8, 2),
    ("mxfp4", "sm80", 128, 128, 128, 8, 2)])
def test_sm8x_epilogue_cases(fmt, arch, bm, bn, bk, warps, stages, cache):
    p = dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=warps, num_stages=stages, split_k=1,
             kernel="w4a16_dequant")
    shared, _ = cross_compile(fmt, p, arch, cache_dir=cache)
    assert smem_bytes(p, fmt, get_arch(arch)) == shared


# ---- issue #14: configs outside the default space --------------------------------------------------
# Each was a wrong figure before (the 512 B under-estimate at BLOCK_N 16 with 6/8 stages, the
# wgmma/tcgen05 charge where Triton falls back to mma.sync, the unpipelined weight tile, sm100
# tensor memory) or is outside the region the model was checked on. Where the verdict answers
# from the model it must equal the compiler; elsewhere it is unknown, and with the compiler-figure
# provider it carries the compiler's own figure.
OUTSIDE = [
    ("nvfp4", "sm90", 64, 16, 64, 4, 6), ("nvfp4", "sm100", 64, 16, 64, 4, 8),
    ("nvfp4", "sm120", 16, 16, 128, 4, 4), ("nvfp4", "sm90", 64, 64, 128, 1, 3),
    ("nvfp4", "sm100", 128, 128, 128, 2, 3), ("nvfp4", "sm100", 128, 128, 128, 16, 3),
    ("nvfp4", "sm120", 16, 32, 64, 16, 3), ("nvfp4", "sm89", 16, 32, 64, 16, 3),
    ("nvfp4", "sm100", 256, 64, 128, 4, 2), ("nvfp4", "sm90", 128, 64, 128, 8, 8),
    ("nvfp4", "sm90", 64, 32, 64, 16, 2), ("mxfp4", "sm100", 128, 64, 128, 16, 3),
    ("nvfp4", "sm120", 16, 32, 512, 4, 2),
]


@pytest.mark.parametrize("fmt,arch,bm,bn,bk,warps,stages", OUTSIDE)
def test_outside_the_default_space(fmt, arch, bm, bn, bk, warps, stages, cache):
    from autotune.tactics.triton_fp4.figures import CompiledFigures
    from autotune.tactics.triton_fp4.smem import tmem_columns
    from tools.triton_smem.compiled import shared_of
    p, a = Problem.dense(4096, 4096, fmt), get_arch(arch)
    t = Tactic("triton", kernel="w4a16_dequant", block_m=bm, block_n=bn, block_k=bk, group_m=1,
               num_warps=warps, num_stages=stages, split_k=1)
    shared, cols = shared_of(fmt, t.params, arch, cache_dir=cache)
    v = FAM.verdict(p, t, a)
    if v.ok is None:
        assert v.reason.startswith("unknown: ") and v.smem_bytes is None
    else:
        assert (v.smem_bytes, tmem_columns(t.params, fmt, a)) == (shared, cols)
    vc = FAM.with_compiler(CompiledFigures(triton_cache=cache)).verdict(p, t, a)
    assert vc.smem_bytes == shared and vc.ok == (shared <= a.smem_per_block_optin and cols <= 512)


def test_compiler_figures_are_cached_per_version_and_arch(tmp_path, cache):
    from autotune.tactics.triton_fp4.figures import CompiledFigures
    p = Problem.dense(4096, 4096, "nvfp4")
    t = Tactic("triton", kernel="w4a16_dequant", block_m=64, block_n=16, block_k=64, group_m=1,
               num_warps=4, num_stages=2, split_k=1)
    first = CompiledFigures(tmp_path / "figures.json", triton_cache=cache)
    fig = first(p, t, get_arch("sm90"))
    assert fig is not None and first.compiles == 1 and first(p, t, get_arch("sm90")) == fig and first.compiles == 1
    again = CompiledFigures(tmp_path / "figures.json", triton_cache=cache)
    assert again(p, t, get_arch("sm90")) == fig and again.compiles == 0         # from the file
    other = CompiledFigures(tmp_path / "figures.json", compiler_version="0.0-other", triton_cache=cache)
    assert other.key(p, t, get_arch("sm90")) != again.key(p, t, get_arch("sm90"))
    assert other.key(p, t, get_arch("sm90")) != other.key(p, t, get_arch("sm100"))


def test_the_search_provider_keeps_figures_in_the_tactic_cache(tmp_path, cache):
    """`with_compiler_figures(store)` (what a live search gives the family): an unknown config is
    compiled once, its real footprint decides, and any later search on the cache reads the figure
    (keyed by Triton version, arch, format, tactic and the member's sources) without compiling."""
    from autotune.cache import Store
    from tools.triton_smem.compiled import shared_of
    p, a = Problem.dense(4096, 4096, "nvfp4"), get_arch("sm90")
    t = Tactic("triton", kernel="w4a16_dequant", block_m=64, block_n=16, block_k=64, group_m=1,
               num_warps=4, num_stages=2, split_k=1)
    assert FAM.verdict(p, t, a).unchecked                      # outside the checked region
    shared, _ = shared_of("nvfp4", t.params, "sm90", cache_dir=cache)
    with Store(tmp_path / "c.db") as s:
        fam = FAM.with_compiler_figures(s)
        fam.compiler.triton_cache = cache
        v = fam.verdict(p, t, a)
        assert (v.ok, v.smem_bytes) == (shared <= a.smem_per_block_optin, shared) and fam.compiler.compiles == 1
        later = FAM.with_compiler_figures(s)
        assert later.verdict(p, t, a) == v and later.compiler.compiles == 0
        assert FAM.verdict(p, t, a).unchecked                  # the family itself never made one
