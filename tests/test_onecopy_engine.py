"""One-copy serving as an engine uses it: `one_copy_upto` implies one copy, one copy without it
chooses its layout by the decode range (`onecopy.DECODE_UPTO`), never by every rung, and a
dispatcher about to hold two copies of weights that would not fit the device twice says so once.
CPU: the `cudacpu` test family stands for the cuda layout (tests/test_onecopy.py)."""
from __future__ import annotations

import warnings

import pytest

from autotune.runtime import onecopy
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4Linear
from autotune.tactics.base import PLAIN_LAYOUT
from autotune.tactics.cuda import layout as L
from test_onecopy import ARCH, C1, C2, CPU, MIXED, P, T64, check_numbers, disp, weight

#: decode rungs read the cuda layout, more rungs (all past the decode range) the plain one
WIDE = ((1, C1), (8, C2), (1024, T64), (2048, T64), (4096, T64))


@pytest.fixture
def fam(register_family):
    return register_family("cudacpu", "tests.families.cuda_cpu:CudaCpu")


def quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def test_one_copy_upto_alone_means_one_copy(tmp_path, fam):
    d = disp(tmp_path, WIDE, one_copy_upto=8)
    assert d.policy.one_copy and d.policy.one_copy_upto == 8
    w, w0 = weight(1)
    bt = quiet(lambda: d.bind(P, w))
    assert bt.one_copy and bt.layout == L.LAYOUT and list(bt.packs) == [L.LAYOUT] and bt.extra_bytes == 0
    layer = quiet(lambda: FP4Linear(weight(2)[0], dispatcher=d))      # a layer follows its dispatcher's policy
    assert layer.bound.one_copy and layer.bound.layout == L.LAYOUT
    check_numbers(bt, w0)
    assert not quiet(lambda: FP4Linear(weight(3)[0], dispatcher=d, one_copy=False)).bound.one_copy   # told: kept


def test_one_copy_chooses_by_the_decode_range_not_every_rung(tmp_path, fam):
    """Three of five rungs read the plain layout, all past DECODE_UPTO: every rung would choose it
    and run the large-M layout's substitute at M = 1; the decode range chooses the cuda layout."""
    d = disp(tmp_path, WIDE, one_copy=True)
    w, w0 = weight(4)
    bt = quiet(lambda: d.bind(P, w))
    assert onecopy.DECODE_UPTO == 512 and bt.layout == L.LAYOUT
    assert [b for b, _, _ in bt.substituted] == [1024, 2048, 4096]
    assert onecopy.plan(d.table(P), ARCH, "cpu").upto == onecopy.DECODE_UPTO
    every = onecopy.plan(d.table(P), ARCH, "cpu", upto=1 << 20)        # every rung, asked for explicitly
    assert every.layout == PLAIN_LAYOUT and every.upto == 1 << 20
    check_numbers(bt, w0)


def test_two_copies_that_would_not_fit_warn_once_in_one_line(tmp_path, fam, monkeypatch):
    w = weight(5)[0]
    monkeypatch.setattr(onecopy, "device_bytes", lambda device: int(1.5 * w.nbytes))   # fits once, not twice
    d = disp(tmp_path, MIXED)
    with pytest.warns(UserWarning) as got:
        d.bind(P, w)                                # the cuda layout packed beside the checkpoint
        d.bind(P, weight(6)[0])
        FP4Linear(weight(7)[0], dispatcher=d)
    lines = [str(x.message) for x in got if "two copies" in str(x.message)]
    assert len(lines) == 1 and "\n" not in lines[0] and "one_copy_upto" in lines[0]
    # one copy (or a device they fit twice) says nothing
    for policy in ({"one_copy": True}, {"one_copy_upto": 64}):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            disp(tmp_path, MIXED, **policy).bind(P, weight(8)[0])
        assert not [r for r in rec if "two copies" in str(r.message)]
    monkeypatch.setattr(onecopy, "device_bytes", lambda device: 100 * w.nbytes)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        disp(tmp_path, MIXED).bind(P, weight(9)[0])
    assert not [r for r in rec if "two copies" in str(r.message)]


def test_a_plain_table_holds_no_second_copy(tmp_path, fam):
    assert onecopy.copies(disp(tmp_path, ((1, T64), (8, T64))).table(P)) == 0


def test_cpu_has_no_fixed_device_size():
    assert onecopy.device_bytes("cpu") is None
    assert CPU.device == "cpu"
