"""One copy of the weight: a bound table in one-copy mode serves every M from
one layout, packs it in place over the checkpoint tensors where the family can (extra_bytes 0),
reports the rungs it substituted, and refuses anything that would read the bytes as a checkpoint.

CPU only: the `cuda` family's layout runs in plain PyTorch; its launch needs CuPy and a GPU, so the
end-to-end checks bind `cudacpu` (tests/families/cuda_cpu.py: the real layout and pack, the
kernel's decode emulated bit for bit) and compare with float64."""
from __future__ import annotations

import warnings

import pytest
import torch

from helpers import keyed
from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import FP4Weight, held_layout, quantize
from autotune.core.operands import OperandError, check_weight
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.runtime.bound import extra_bytes
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4Linear
from autotune.cache import Store
from autotune.tactics import registry
from autotune.tactics.base import PLAIN_LAYOUT
from autotune.tactics.cuda import layout as L

CPU = cpu()
ARCH = ARCHS["sm90"]
P = Problem.dense(128, 256)
C1 = Tactic("cudacpu", warps_k=1, stages=2, tiles_n=1)
C2 = Tactic("cudacpu", warps_k=2, stages=4, tiles_n=2)
T64 = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
MIXED = ((1, C1), (8, C2), (64, T64))          # cuda layout at small M, another layout at M = 64


@pytest.fixture
def fam(register_family):
    return register_family("cudacpu", "tests.families.cuda_cpu:CudaCpu")


def disp(tmp_path, winners, **policy) -> Dispatcher:
    if not (tmp_path / "c.db").exists():
        _store(tmp_path, winners)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "c.db", env=CPU, arch=ARCH, record_misses=False, warn=False, **policy)
    assert d.skipped == {} and d.table(P).tactics == tuple(t for _, t in winners)
    return d


def _store(tmp_path, winners) -> None:
    with Store(tmp_path / "c.db") as s:
        for b, t in winners:
            lib = CPU.lib_key(registry.get(t.family).depends_on)
            s.put_winner(keyed(Winner(P.key, b, CPU.device_key, t.id, t.family, t.to_json(), lib, 1.0, T64.id, 1.0, 1.0)))


def weight(seed=0) -> tuple[FP4Weight, FP4Weight]:
    """A weight and an untouched clone of its checkpoint bytes."""
    torch.manual_seed(seed)
    w = quantize(torch.randn(P.n, P.k))
    return w, FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt)


def same(a: FP4Weight, b: FP4Weight) -> bool:
    return (torch.equal(a.packed, b.packed) and torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))
            and torch.equal(a.global_scale.reshape(()), b.global_scale.reshape(())))


def check_numbers(call, w0: FP4Weight, ms=(1, 5, 8, 64, 100)) -> None:
    for m in ms:
        x = torch.randn(m, P.k, dtype=torch.bfloat16)
        ref = x.double() @ w0.dequantize(torch.float64).T
        y = call(x)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, m


def test_mixed_table_is_served_from_one_layout_packed_in_place(tmp_path, fam):
    d = disp(tmp_path, MIXED)
    w, w0 = weight()
    ptrs = (w.packed.untyped_storage().data_ptr(), w.scales.untyped_storage().data_ptr())
    with pytest.warns(UserWarning, match="one copy of the weight .cuda-mma-a-frag-v1.: M=64 runs cudacpu"):
        bt = d.bind(P, w, one_copy=True)
    sub = fam.default(P, ARCH)
    assert bt.layout == bt.held == L.LAYOUT and list(bt.packs) == [L.LAYOUT]
    assert bt.substituted == ((64, T64, sub),)                 # what the one copy costs, per rung
    pk = bt.packs[L.LAYOUT]
    assert bt.extra_bytes == 0 and extra_bytes(w, [pk]) == 0   # the checkpoint tensors hold the layout
    assert (pk.packed.untyped_storage().data_ptr(), pk.scales.untyped_storage().data_ptr()) == ptrs
    assert all(bt.launcher(m).weight is pk for m in (1, 8, 64, 1000))
    fresh = L.pack(w0)
    assert torch.equal(w.packed, fresh.packed) and torch.equal(w.scales.view(torch.uint8), fresh.scales)
    assert same(L.unpack(pk), w0)                              # the inverse restores the checkpoint bit for bit
    check_numbers(bt, w0)


def test_a_weight_packed_in_place_is_never_read_as_a_checkpoint(tmp_path, fam):
    d = disp(tmp_path, MIXED)
    w, w0 = weight(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = d.bind(P, w, one_copy=True)
    assert held_layout(w.packed) == L.LAYOUT
    x = torch.randn(3, P.k, dtype=torch.bfloat16)
    why = "bytes .*hold the cuda-mma-a-frag-v1 layout|overwritten in place by the cuda-mma-a-frag-v1 layout"
    for refused in (lambda: bt.weight, lambda: w.dequantize(), lambda: check_weight(P, w),
                    lambda: d((3, P.n, P.k))(x, w),           # the unbound form, with the stale weight object
                    lambda: d.bind(P, w), lambda: d.bind(P, w, one_copy=True), lambda: L.pack(w)):
        with pytest.raises((ValueError, OperandError), match=why) as e:
            refused()
        assert "\n" not in str(e.value)
    assert held_layout(w.to("cpu").packed) == L.LAYOUT        # a moved copy keeps the mark
    check_numbers(bt, w0, ms=(3,))                            # the binding itself still answers


def test_default_mode_is_unchanged(tmp_path, fam):
    d = disp(tmp_path, MIXED)
    w, w0 = weight(2)
    bt = d.bind(P, w)
    assert bt.layout is None and bt.held is None and bt.substituted == ()
    assert list(bt.packs) == [L.LAYOUT, PLAIN_LAYOUT] and bt.launcher(64).weight is bt.packs[PLAIN_LAYOUT]
    assert bt.extra_bytes == w.packed.nbytes + w.scales.nbytes     # the cuda layout beside the checkpoint
    assert held_layout(w.packed) is None and same(w, w0) and bt.weight is w
    check_numbers(bt, w0)


def test_a_tie_takes_the_default_layout_and_keeps_the_checkpoint(tmp_path, fam):
    d = disp(tmp_path, ((1, C1), (64, T64)))
    w, w0 = weight(3)
    with pytest.warns(UserWarning, match="M=1 runs torch"):
        bt = d.bind(P, w, one_copy=True)
    dt = d.table(P).default_tactic
    assert dt.family == "torch" and bt.layout == PLAIN_LAYOUT and bt.held is None
    assert bt.substituted == ((1, C1, dt),) and bt.extra_bytes == 0 and same(w, w0)
    check_numbers(bt, w0)


def test_layer_to_rewraps_the_moved_bytes_without_packing_again(tmp_path, fam, monkeypatch):
    packs = []
    real = L.pack
    monkeypatch.setattr(L, "pack", lambda w, inplace=False: (packs.append(inplace), real(w, inplace))[1])
    d = disp(tmp_path, MIXED)
    w, w0 = weight(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = FP4Linear(w, dispatcher=d, one_copy=True)
    assert packs == [True] and f.prepacked_extra_bytes == 0 and f.packed is w.packed
    x = torch.randn(5, P.k, dtype=torch.bfloat16)
    y = f(x)
    old = f.bound.launcher(5).weight
    f.to("cpu")                                          # same tensors: re-wrapped, not packed
    f._apply(torch.clone)                                # what .to(device) does: new storage for every buffer
    new = f.bound.launcher(5).weight
    assert packs == [True]                               # never packed twice
    assert new.packed.data_ptr() == f.packed.data_ptr() != old.packed.data_ptr()
    assert held_layout(f.packed) == L.LAYOUT and f.prepacked_extra_bytes == 0
    fresh = L.pack(w0)
    assert torch.equal(f.packed, fresh.packed) and torch.equal(f.scales_u8, fresh.scales)
    assert torch.equal(f(x), y)
    assert same(L.unpack(new), w0)
    for refused in (lambda: f.weight, f.state_dict, lambda: f.load_state_dict({})):
        with pytest.raises(RuntimeError, match="hold the cuda-mma-a-frag-v1 layout .one_copy packed them in place"):
            refused()


def test_a_pin_to_another_layout_is_refused(tmp_path, fam):
    d = disp(tmp_path, MIXED)
    w, w0 = weight(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = FP4Linear(w, dispatcher=d, one_copy=True)
    x = torch.randn(3, P.k, dtype=torch.bfloat16)
    y = f(x)
    d.pin(P, T64)
    with pytest.raises(ValueError, match="holds the cuda-mma-a-frag-v1 layout in place; the table now wants "
                                         "fp4-linear") as e:
        f(x)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError):                      # refused on every call, never a wrong number
        f(x)
    d.unpin(P)
    assert torch.equal(f(x), y)
    d.pin(P, C2)                                         # a pin that reads the held layout is served
    assert f.bound.launcher(3).weight is f.bound.packs[L.LAYOUT] and f.bound.extra_bytes == 0
    check_numbers(f, w0, ms=(3, 64))


def test_cuda_family_packs_in_place_and_wraps_moved_bytes():
    fam = registry.get("cuda")
    w, w0 = weight(6)
    pk = fam.pack_inplace(L.LAYOUT, w)
    assert pk.layout == L.LAYOUT and pk.packed is w.packed and extra_bytes(w, [pk]) == 0
    assert pk.scales.untyped_storage().data_ptr() == w.scales.untyped_storage().data_ptr()
    fresh = fam.pack(L.LAYOUT, w0)
    assert torch.equal(pk.packed, fresh.packed) and torch.equal(pk.scales, fresh.scales)
    assert same(L.unpack(pk), w0)
    moved = FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt)
    again = fam.pack_inplace(L.LAYOUT, moved, already_packed=True)     # wrap: no packing
    assert again.packed is moved.packed and torch.equal(again.packed, fresh.packed)
    assert torch.equal(again.scales, fresh.scales) and torch.equal(L.emulate_dequantize(again), w0.dequantize())
    strided = FP4Weight(w0.packed.t().contiguous().t(), w0.scales, w0.global_scale, w0.fmt)
    assert fam.pack_inplace(L.LAYOUT, strided) is None                 # gets its own copy instead
    assert fam.pack_inplace(PLAIN_LAYOUT, w0) is None and registry.get("torch").pack_inplace(PLAIN_LAYOUT, w0) is None


def test_load_state_dict_rebinds_a_copied_layout(tmp_path, fam):
    """Default mode keeps the cuda layout as a copy beside the checkpoint bytes: loading another
    weight's state must re-pack it, never leave the old weight's numbers in the cuda launchers."""
    d = disp(tmp_path, MIXED)
    w, _ = weight(0)
    w2, w20 = weight(1)
    layer = FP4Linear(w, dispatcher=d)
    assert layer.prepacked_extra_bytes > 0            # the cuda layout is a second copy here
    layer.load_state_dict(FP4Linear(w2, dispatcher=d).state_dict())
    check_numbers(layer, w20)


def test_cuda_layout_launcher_checks_x_and_out(fam):
    """The cuda family's own bind (cudacpu replaces only the runner) checks x and out in one line each."""
    w, w0 = weight()
    lay = fam.layout(C1)
    launch = fam.bind(P, C1, fam.pack(lay, w), "cpu")
    with pytest.raises(OperandError, match=r"x is 2x255, expected M x 256"):
        launch(torch.zeros(2, P.k - 1, dtype=torch.bfloat16))
    with pytest.raises(OperandError, match="x is torch.float32"):
        launch(torch.zeros(2, P.k))
    with pytest.raises(OperandError, match="out"):
        launch(torch.zeros(2, P.k, dtype=torch.bfloat16), out=torch.empty(3, P.n, dtype=torch.bfloat16))
    check_numbers(launch, w0, ms=(1, 3))
    # the real bind's weight checks run too: a tiling the kernel can't cover is refused at bind
    with pytest.raises(ValueError, match=r"K=256 is not a multiple of 128\*warps_k=512"):
        fam.bind(P, Tactic("cudacpu", warps_k=4, stages=2, tiles_n=1), fam.pack(lay, w), "cpu")


def test_dense_bound_launcher_carries_capture_safe(fam):
    """FamilyBase's dense bound launcher keeps the built kernel's capture_safe (the cuda runner's);
    a plain function is not capture-safe."""
    from autotune.tactics.base import FunctionKernel
    w, _ = weight()
    packed = fam.pack(fam.layout(C1), w)

    def kernel(x, w, out=None):
        return out
    assert fam.bind_kernel(P, kernel, packed).caps.capture_safe is False
    assert fam.bind_kernel(P, FunctionKernel(kernel, capture_safe=True), packed).caps.capture_safe is True


def test_one_copy_upto_chooses_the_layout_by_the_served_range(tmp_path, fam):
    """More rungs read the plain layout (M >= 64), but an engine that serves decode (M <= 8) asks for
    the layout of those rungs: `one_copy_upto` counts only the rungs up to it; the rest are served,
    substituted and reported (the folded GLM-5 w13's tie served Triton at M = 1..64 on 2026-12-05)."""
    table = ((1, C1), (8, C2), (64, T64), (128, T64), (256, T64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w, w0 = weight(4)
        bt = disp(tmp_path, table, one_copy=True).bind(P, w)
        assert bt.layout == PLAIN_LAYOUT and [b for b, _, _ in bt.substituted] == [1, 8]
        decode = disp(tmp_path, table, one_copy=True, one_copy_upto=8)
        w2, w20 = weight(5)
        bt2 = decode.bind(P, w2)
        layer = FP4Linear(weight(6)[0], dispatcher=decode, one_copy=True)
    sub = fam.default(P, ARCH)
    assert bt2.layout == L.LAYOUT and bt2.substituted == ((64, T64, sub), (128, T64, sub), (256, T64, sub))
    assert list(bt2.packs) == [L.LAYOUT] and all(bt2.launcher(m).weight is bt2.packs[L.LAYOUT] for m in (1, 8, 256))
    assert layer.bound.layout == L.LAYOUT                   # layers built on the dispatcher follow its policy
    check_numbers(bt2, w20)
    # a range below every rung still chooses by the smallest rung
    low = disp(tmp_path, table, one_copy=True, one_copy_upto=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert low.bind(P, weight(7)[0]).layout == L.LAYOUT
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="one_copy_upto must be a positive int"):
            Dispatcher(tmp_path / "c.db", env=CPU, arch=ARCH, record_misses=False, warn=False, one_copy_upto=bad)


def test_a_substituted_rung_runs_the_layouts_measured_best(tmp_path, fam):
    """Where the cache holds the rung's trials, a substituted rung runs the fastest servable trial of
    the chosen layout there — not the family's untuned default; failed, stale and other-layout
    trials are passed over; without trials (an export) the default stays."""
    import dataclasses

    from autotune.core.records import Trial
    d0 = disp(tmp_path, MIXED)          # the store with MIXED's winners
    C3 = Tactic("cudacpu", warps_k=4, stages=2, tiles_n=1)

    def trial(t, us, status="ok", bucket=64):
        lib = CPU.lib_key(registry.get(t.family).depends_on)
        return keyed(Trial(P.key, bucket, t.id, t.family, t.to_json(), CPU.device_key, lib, status, median_us=us))
    with Store(tmp_path / "c.db") as s:
        s.put_trials([trial(T64, 1.0), trial(C2, 5.0), trial(C3, 2.0, status="failed"),
                      dataclasses.replace(trial(C1, 0.5), code_key="stale"), trial(C1, 4.0, bucket=8)])
    del d0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = disp(tmp_path, MIXED)
        bt = d.bind(P, weight(8)[0], one_copy=True)
    assert bt.layout == L.LAYOUT and bt.substituted == ((64, T64, C2),)    # the measured cuda best at 64
    assert d.best_of(P)(64, L.LAYOUT) == C2 and d.best_of(P)(64, PLAIN_LAYOUT) == T64
    assert d.best_of(P)(1000, L.LAYOUT) is None
    check_numbers(bt, weight(8)[1])
    # a halving loser (checked, timed in its round) is measured too: where the layout has only
    # losers at a rung, or a faster one, it runs instead of the default or a slower survivor
    C4 = Tactic("cudacpu", warps_k=2, stages=2, tiles_n=1)
    with Store(tmp_path / "c.db") as s:
        s.put_trials([trial(C4, 3.0, status="dropped"), trial(C1, 7.0, status="dropped", bucket=1000)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d2 = disp(tmp_path, MIXED)
    assert d2.best_of(P)(64, L.LAYOUT) == C4 and d2.best_of(P)(1000, L.LAYOUT) == C1
    # an export's rows are what its checksum (and signature) cover: its trials are never read
    from autotune.runtime import loader
    with Store(tmp_path / "c.db") as s:
        assert loader.bests_by_layout(s, CPU, ARCH, d.builder.kernel, P, 64, immutable=False)[L.LAYOUT] == C4
        s.put_meta("checksum", "sha256:0")
        assert loader.bests_by_layout(s, CPU, ARCH, d.builder.kernel, P, 64, immutable=False) == {}
