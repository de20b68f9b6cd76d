"""No host sync in an eager forward. FP4MoE (fused and unfused, with and without
an expert_map, with the shared expert folded in) and FP4Linear only issue device work; the bad-id
word is sticky on the device and read on request (`routing_errors()`), and AUTOTUNE_CHECK_IDS=1
restores the per-call raise. Counted on the CPU with tests/syncs.py (every aten op a forward runs:
what would sync on a GPU), with the devicemoe test family (the GPU members' contract in device
ops) for the grouped GEMMs; tests/test_nosync_gpu.py is the same on a GPU under
torch.cuda.set_sync_debug_mode("error")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.operands import OperandError
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.runtime.nn import FP4Linear
from tests.helpers import quiet_dispatcher
from tests.syncs import CountSyncs

E, H, I, TOP_K = 6, 64, 32, 2


@pytest.fixture
def devmoe(register_family):
    return register_family("devicemoe", "tests.families.devicemoe:DeviceMoEFamily")


def _disp(tmp_path):
    return quiet_dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"])


def _block(d, *, fused=True, emap=None, shared=False, seed=0, split13=2):
    g = torch.Generator().manual_seed(seed)
    gate, up, down = (torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g) * 3,
                      torch.randn(E, H, I, generator=g))
    kw = {}
    if shared:
        kw["shared"] = FP4MoE.shared_from_float(torch.randn(I, H, generator=g), torch.randn(I, H, generator=g),
                                                torch.randn(H, I, generator=g))
    blk = FP4MoE.from_float(gate, up, down, TOP_K, fused=fused, expert_map=emap, dispatcher=d, **kw)
    d.pin(blk.problem13, Tactic("devicemoe", split_k=split13))
    d.pin(blk.problem2, Tactic("devicemoe", split_k=1))
    return blk


def _routing(m, e_global, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e_global, generator=g)[:TOP_K] for _ in range(m)])
    ids[0, 1] = -1
    return ids, torch.rand(m, TOP_K, generator=g)


CASES = [dict(fused=True), dict(fused=False), dict(fused=True, emap=True), dict(fused=False, emap=True),
         dict(fused=True, shared=True), dict(fused=True, emap=True, shared=True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(k for k, v in c.items() if v) or "unfused")
def test_an_eager_forward_reads_nothing_on_the_host(devmoe, tmp_path, case):
    d = _disp(tmp_path)
    emap = torch.tensor([3, -1, 0, 1, -1, 2, 5, 4]) if case.get("emap") else None
    blk = _block(d, fused=case["fused"], emap=emap, shared=case.get("shared", False))
    e_global = blk.global_experts
    x = torch.randn(5, H).to(torch.bfloat16)
    ids, tw = _routing(5, e_global)
    assert [blk.bound13.launcher(5).caps.checks_ids, blk.bound2.launcher(5).caps.capture_safe] == [True, True]
    blk(x, ids, tw)                                   # binds the pinned launchers (outside the count)
    with CountSyncs() as c:
        y = blk(x, ids, tw)
    assert c.syncs == [] and torch.isfinite(y).all()
    # a bad id: still no read, its token's row NaN, the others unchanged, the word set until read
    bad = ids.clone()
    bad[2, 0] = e_global + 3
    bad[4, 1] = -7
    with CountSyncs() as c:
        yb = blk(x, bad, tw)
    assert c.syncs == []
    rows = torch.isnan(yb).any(1)
    assert rows.tolist() == [False, False, True, False, True] and torch.isnan(yb[[2, 4]]).all()
    assert torch.equal(yb[[0, 1, 3]], y[[0, 1, 3]])
    assert blk.routing_errors(clear=False) == [blk.label]      # sticky: a read without clear leaves it
    assert d.routing_errors() == [blk.label]                   # the dispatcher's one read, and it clears
    assert blk.routing_errors() == [] and d.routing_errors() == []
    blk(x, ids, tw)
    assert blk.routing_errors() == []                          # a good forward sets nothing


def test_the_counter_sees_what_the_old_path_read(devmoe, tmp_path, monkeypatch):
    """AUTOTUNE_CHECK_IDS=1: the launchers and the block read the word after each eager call (the
    per-call raise), and the count says so."""
    monkeypatch.setenv("AUTOTUNE_CHECK_IDS", "1")
    d = _disp(tmp_path)
    blk = _block(d, emap=torch.tensor([3, -1, 0, 1, -1, 2, 5, 4]))
    x = torch.randn(3, H).to(torch.bfloat16)
    ids, tw = _routing(3, blk.global_experts)
    blk(x, ids, tw)
    with CountSyncs() as c:
        blk(x, ids, tw)
    assert len(c.syncs) >= 1 and all("_local_scalar_dense" in s for s in c.syncs), c.syncs
    bad = ids.clone()
    bad[1, 0] = 8
    with pytest.raises(ValueError, match=r"outside \[-1, E\)|outside \[-1, 8\)"):
        blk(x, bad, tw)
    assert blk.routing_errors() == []                          # the raise read and cleared it


def test_kernels_that_do_not_check_ids_get_the_same_contract(tmp_path):
    """The torch family's grouped kernel checks no ids (`checks_ids` False): the block sets NaN
    rows and its word on the device itself (the kernel sees -1 for those slots)."""
    d = _disp(tmp_path)
    blk = FP4MoE.from_float(torch.randn(E, I, H), torch.randn(E, I, H), torch.randn(E, H, I), TOP_K, dispatcher=d)
    assert not blk.bound13.launcher(3).caps.checks_ids
    x = torch.randn(3, H).to(torch.bfloat16)
    ids, tw = _routing(3, E)
    y = blk(x, ids, tw)
    bad = ids.clone()
    bad[1, 1] = E
    yb = blk(x, bad, tw)
    assert torch.isnan(yb[1]).all() and torch.equal(yb[[0, 2]], y[[0, 2]])
    assert blk.routing_errors() == [blk.label] and blk.routing_errors() == []
    blk.check_ids = True
    with pytest.raises(OperandError, match=r"topk_ids hold expert ids outside \[-1, 6\)"):
        blk(x, bad, tw)


def test_fp4linear_forward_reads_nothing(tmp_path):
    d = _disp(tmp_path)
    lin = FP4Linear(quantize(torch.randn(96, 128)), dispatcher=d)
    x = torch.randn(4, 128).to(torch.bfloat16)
    lin(x)
    with CountSyncs() as c:
        lin(x)
        lin(x.float())
    assert c.syncs == []


def test_check_ids_setting(monkeypatch):
    from autotune.core import settings
    monkeypatch.delenv("AUTOTUNE_CHECK_IDS", raising=False)
    assert settings.check_ids() is False
    for v, want in (("1", True), ("true", True), ("0", False), ("false", False)):
        monkeypatch.setenv("AUTOTUNE_CHECK_IDS", v)
        assert settings.check_ids() is want
    monkeypatch.setenv("AUTOTUNE_CHECK_IDS", "yes")
    with pytest.raises(ValueError, match="AUTOTUNE_CHECK_IDS must be 1, true, 0 or false"):
        settings.check_ids()


_INTERP = textwrap.dedent("""
    import json, os, tempfile, warnings
    import torch
    from autotune.core.arch import ARCHS
    from autotune.core.env import cpu
    from autotune.core.tactic import Tactic
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.moe import FP4MoE
    from autotune.tactics.triton_fp4.family import TritonFamily
    from tests.syncs import CountSyncs
    TritonFamily.available = lambda self, device: (True, "")      # the interpreter runs it on the CPU
    warnings.simplefilter("ignore")

    class AtenReads(CountSyncs):
        # aten-level reads only: the interpreter itself (the "device" here) reads memory through numpy
        def __enter__(self):
            return super(CountSyncs, self).__enter__()

        def __exit__(self, *exc):
            return super(CountSyncs, self).__exit__(*exc)

    def forward(check_ids):
        # the setting as the process environment gives it, read when the block is made (FP4MoE)
        os.environ["AUTOTUNE_CHECK_IDS"] = check_ids
        d = Dispatcher(os.path.join(tempfile.mkdtemp(), "n.db"), env=cpu(), arch=ARCHS["cpu"], record_misses=False,
                       warn=False)
        torch.manual_seed(0)
        e, h, i, k = 4, 512, 128, 2
        blk = FP4MoE.from_float(torch.randn(e, i, h), torch.randn(e, i, h), torch.randn(e, h, i), k, dispatcher=d)
        cfg = dict(kernel="moe_decode", route="direct", block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=2)
        d.pin(blk.problem13, Tactic("triton", **cfg, split_k=2))
        d.pin(blk.problem2, Tactic("triton", **cfg, split_k=1))
        x, ids, tw = torch.randn(3, h).to(torch.bfloat16), torch.tensor([[0, 1], [2, -1], [3, 1]]), torch.rand(3, 2)
        blk(x, ids, tw)
        with AtenReads() as c:
            blk(x, ids, tw)
        bad = ids.clone()
        if check_ids == "0":     # with the per-call raise on, the bad forward would raise
            bad[2, 0] = 9
        with AtenReads() as cb:
            yb = blk(x, bad, tw)
        return dict(reads=c.syncs, bad_reads=cb.syncs, nan=torch.isnan(yb).any(1).tolist(),
                    errors=blk.routing_errors() == [blk.label], kernels=[
                        d.rung_for(p, 3)[1].params["kernel"] for p in (blk.problem13, blk.problem2)])

    print(json.dumps({v: forward(v) for v in ("0", "1")}))
""")


@pytest.fixture(scope="module")
def interpreted_forwards():
    """check_ids -> what _INTERP saw of its forwards: both settings run in one process under
    Triton's interpreter (each block made with its own setting and dispatcher), so torch and Triton
    load once."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP], cwd=root, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check_ids", ["0", "1"])
def test_moe_decode_launchers_read_nothing_in_the_interpreter(check_ids, interpreted_forwards):
    """The real moe_decode launchers (split-K w13 + SwiGLU, w2 + reduce) through FP4MoE under
    Triton's interpreter: no aten-level read per forward (the bad-id word stays on the device);
    with AUTOTUNE_CHECK_IDS=1 each launcher reads it after the call."""
    out = interpreted_forwards[check_ids]
    assert out["kernels"] == ["moe_decode", "moe_decode"], out
    if check_ids == "0":
        assert out["reads"] == [] and out["bad_reads"] == [], out
        assert out["nan"] == [False, False, True] and out["errors"] is True, out
    else:
        assert len(out["reads"]) >= 2 and all("_local_scalar_dense" in s for s in out["reads"]), out
