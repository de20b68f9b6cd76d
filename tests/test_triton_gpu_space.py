"""Every kept config of the triton family's space at the GLM-5 TP8 dense shapes, on a CUDA GPU.

Compiles the space in parallel first (TritonFamily.precompile, the search's path), then runs each
config once at M = 37 (masks rows) and M = 1 with fresh random inputs into a NaN-poisoned output
and compares with the float64 reference. Also checks the compiled shared memory against the
verdict's model for every config. Skipped without a GPU (marker gpu).
"""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem
from autotune.core.arch import detect
from autotune.core.tactic import Tactic
from autotune.tactics.triton_fp4 import TritonFamily

pytestmark = pytest.mark.gpu

GLM5_TP8_DENSE = [Problem.dense(3072, 6144), Problem.dense(6144, 1536), Problem.dense(512, 6144), Problem.dense(6144, 256)]


def _pre(args):
    key, tj, arch = args
    from autotune.core.arch import get_arch
    return TritonFamily().precompile(Problem.from_key(key), Tactic.from_json(tj), get_arch(arch))


@pytest.fixture(scope="module")
def kept():
    fam, arch = TritonFamily(), detect()
    out = {p: [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok] for p in GLM5_TP8_DENSE}
    uniq = {t.to_json(): p for p, ts in out.items() for t in ts if t["kernel"] == "w4a16_dequant"}
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_pre, [(p.key, tj, arch.name) for tj, p in uniq.items()]))
    return out


@pytest.mark.parametrize("p", GLM5_TP8_DENSE, ids=lambda p: p.key)
def test_every_kept_config_matches_float64(p, kept):
    fam, arch = TritonFamily(), detect()
    bad = []
    for m in (37, 1):
        s = inputs.make_inputs(p, m, "cuda", seed=m + p.n)[0]
        ref = inputs.reference(p, s)
        for t in kept[p]:
            k = fam.build(p, t, "cuda")
            try:
                inputs.check(p, k, s, ref)
            except inputs.CheckFailed as e:
                bad.append(f"{t} M={m}: {e}")
            if t["kernel"] == "w4a16_dequant" and k.smem_compiled != fam.verdict(p, t, arch).smem_bytes:
                bad.append(f"{t}: compiled smem {k.smem_compiled} != model {fam.verdict(p, t, arch).smem_bytes}")
        del ref
        torch.cuda.empty_cache()
    assert not bad, f"{len(bad)} failures, e.g. " + "; ".join(bad[:5])
