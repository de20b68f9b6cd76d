"""w13's L2 prefetch of w2's weights (moe_mma's `prefetch=`, FP4MoE's `prefetch_w2`): the kernel's slice
arithmetic compiled by nvcc for the host against its Python mirror (every expert's bytes covered once,
16-byte aligned), the instructions in the compiled PTX after the PDL wait, the launcher's arguments
(planned = whole way, checked, none on the aligned route) and FP4MoE's rule (which M, which tensors).
Whether it pays is the step bench's question (docs/decisions/0004-prefetch-w2-off.md), not a test's."""
from __future__ import annotations

import re
import threading
import subprocess
from pathlib import Path

import pytest
import torch

from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime import prefetch as PF
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import moe as MOE
from tests.families.cuda_moe_cpu import cpu_alignment
from tests.test_cuda_moe_plan import MoeRec, TokRec, _operands, _weight

HERE = Path(B.__file__).parent
W13 = Problem.moe(64, 512, 6, 3, epilogue="swiglu")
MMA = Tactic("cuda", kernel="moe_mma", m_tiles=1, warps_k=2, stages=2, tiles_n=2, split_k=2)
TOK = Tactic("cuda", kernel="moe_tok", warps_k=2, stages=2, tiles_n=2)
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="no nvcc")


def py_slice(s: int, n_s: int, nbytes: int) -> tuple[int, int]:
    chunk = -(-nbytes // (n_s * 16)) * 16
    a = s * chunk
    return (min(a, nbytes), max(0, min(chunk, nbytes - a)))


def _pf_slice_text() -> str:
    src = (HERE / "moe_common.cuh").read_text()
    m = re.search(r"static __host__ __device__ __forceinline__ longlong2 pf_slice\(.*?\n}\n", src, re.S)
    assert m, "pf_slice is not in moe_common.cuh"
    return m.group(0)


CASES = [(1, 786432), (16, 786432), (16, 98304), (32, 98304), (96, 786432), (7, 48), (5, 16), (3, 2 ** 31 - 16),
         (384, 98304), (132, 1572864)]


@NO_NVCC
def test_the_kernels_slices_cover_each_experts_bytes_once(tmp_path):
    """pf_slice as the kernel has it, compiled by nvcc for the host: the Python mirror's slices, which
    tile [0, bytes) in order, disjoint, 16-byte aligned, none past the end."""
    prog = tmp_path / "s.cu"
    prog.write_text("#include <cstdio>\n#include <cstdlib>\n" + _pf_slice_text() + """
int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const int ns = atoi(argv[i]); const long long b = atoll(argv[i + 1]);
    for (int s = 0; s < ns; ++s) { const longlong2 v = pf_slice(s, ns, b); printf("%lld %lld\\n", v.x, v.y); }
  }
  return 0;
}
""")
    exe = tmp_path / "s"
    r = subprocess.run([B.nvcc(), "-o", str(exe), str(prog)], capture_output=True, text=True)
    if r.returncode and "host compiler" in (r.stderr + r.stdout).lower():
        pytest.skip("nvcc has no host compiler here")
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)] + [str(v) for c in CASES for v in c], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    got = [tuple(map(int, ln.split())) for ln in out if ln.strip()]
    i = 0
    for ns, nbytes in CASES:
        mine = [py_slice(s, ns, nbytes) for s in range(ns)]
        assert got[i:i + ns] == mine, (ns, nbytes)
        i += ns
        pos = 0
        for a, ln in mine:
            assert a % 16 == 0 and ln % 16 == 0 and ln >= 0
            if ln:
                assert a == pos
                pos = a + ln
        assert pos == nbytes, (ns, nbytes)
    assert i == len(got)


def _ptx(cfg, arch: str, tmp: Path) -> str:
    src, out = tmp / "k.cu", tmp / "k.ptx"
    src.write_text(B.text(cfg))
    subprocess.run([B.nvcc(), "-ptx", f"-arch={arch}", "-O3", *B.options(cfg), "-o", str(out), str(src)],
                   check=True, capture_output=True)
    return out.read_text()


@NO_NVCC
@pytest.mark.parametrize("arch,instr", [("sm_90", "cp.async.bulk.prefetch.L2.global"),
                                        ("sm_80", "prefetch.global.L2"), ("sm_120", "cp.async.bulk.prefetch.L2.global")])
def test_the_prefetch_is_compiled_in_after_the_wait(tmp_path, arch, instr):
    cfg = MOE.config(W13, MMA)
    ptx = _ptx(cfg, arch, tmp_path)
    assert instr in ptx
    if arch != "sm_80":
        assert ptx.index("griddepcontrol.wait") < ptx.index(instr)


def _pf(prob, e=None):
    """w2-like stacked tensors: packed [E, 64, 256] uint8, scales [E, 64, 32] uint8."""
    e = prob.experts if e is None else e
    return (torch.zeros(e, 64, 256, dtype=torch.uint8), torch.zeros(e, 64, 32, dtype=torch.uint8))


@pytest.mark.parametrize("m", [1, 3])
def test_the_launch_carries_the_prefetch_and_a_plan_keeps_it(m):
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    pf = _pf(W13)
    x, ids, tw = _operands(W13, m, 0)
    run(x, w, ids, tw, prefetch=pf)
    args = run.calls[-1][2]
    assert args[-4:] == (pf[0].data_ptr(), pf[1].data_ptr(), 64 * 256, 64 * 32)
    checks = run.checks
    run(x, w, ids, tw, prefetch=pf)                           # planned, the same arguments (out is fresh)
    again = run.calls[-1][2]
    assert run.checks == checks and again[:3] + again[4:] == args[:3] + args[4:]
    run(x, w, ids, tw)                                        # no prefetch: not that plan
    assert run.checks == checks + 1 and run.calls[-1][2][-4:] == MOE.NO_PREFETCH
    other = _pf(W13)
    run(x, w, ids, tw, prefetch=other)                        # another pair: its own pointers
    assert run.calls[-1][2][-4:-2] == (other[0].data_ptr(), other[1].data_ptr())


def test_the_aligned_route_prefetches_nothing():
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    m = MOE.ALIGN_PAIRS // W13.top_k + 1                      # past the direct route
    x, ids, tw = _operands(W13, m, 0)
    al = cpu_alignment(ids, W13.experts, run.aligned_block_m(m))   # moe_align's, made on the CPU
    run(x, w, ids, tw, prefetch=_pf(W13), aligned=al)
    assert run.calls and all(c[2][-4:] == MOE.NO_PREFETCH for c in run.calls)


@pytest.mark.parametrize("bad,msg", [
    (lambda p: p[0], "tuple of two"),
    (lambda p: (p[0], p[1], p[1]), "tuple of two"),
    (lambda p: (p[0][:3], p[1]), r"\[6, \.\.\.\]"),
    (lambda p: (p[0].transpose(1, 2), p[1]), "contiguous"),
    (lambda p: (p[0], torch.zeros(6, 3, dtype=torch.uint8)), "multiple of 16"),
    (lambda p: (torch.zeros(6 * 64 * 256 + 1, dtype=torch.uint8)[1:].view(6, 64, 256), p[1]), "16-byte aligned"),
])
def test_a_bad_prefetch_is_one_line(bad, msg):
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    x, ids, tw = _operands(W13, 1, 0)
    with pytest.raises(ValueError, match=msg) as ei:
        run(x, w, ids, tw, prefetch=bad(_pf(W13)))
    assert "\n" not in str(ei.value) and not run.calls


def test_moe_tok_takes_no_prefetch():
    assert MOE.MoeLaunch.caps.prefetches and not TokRec.caps.prefetches
    k = TokRec(Problem.moe(64, 512, 6, 3, epilogue="reduce"), TOK, "cpu")
    with pytest.raises(ValueError, match="no prefetch"):
        k(None, None, None, prefetch=_pf(W13))


def test_the_rule_fits_glm5_at_m1_only_on_an_h200():
    """GLM-5 TP8 folded (257 experts, 9 slots): w13 1.77 MB + w2 0.88 MB per expert; the H200's 60 MiB L2."""
    per, l2 = 512 * 6144 // 2 + 512 * 6144 // 16 + 6144 * 256 // 2 + 6144 * 256 // 16, 62914560
    assert PF.fits(9, 257, per, l2) and not PF.fits(18, 257, per, l2)
    assert PF.fits(10 ** 6, 4, per, l2)              # few experts: any M fits
    assert not PF.fits(1, 257, per, 0)               # no L2 known (CPU): never


@pytest.fixture
def fam(register_family):
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    from tests.families import cuda_moe_cpu
    return cuda_moe_cpu


def test_fp4moe_prefetches_w2_for_w13_where_it_fits(tmp_path, fam):
    """FP4MoE(prefetch_w2): w13's launcher gets w2's (packed, scales) as w2's launcher reads them, at an M
    whose experts' bytes fit half the L2 and on the direct route only; w2's launcher gets none; off by
    default ($AUTOTUNE_PREFETCH_W2); switching it re-forms the call. The block still matches float64."""
    from tests.test_moe_shared_slot import E, H, TOP_K, _block, _ref
    blk, routed, shared = _block(tmp_path)
    assert blk.prefetch_w2 is False
    g = torch.Generator().manual_seed(5)

    def call(m):
        x = torch.randn(m, H, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m)]).int()
        tw = torch.rand(m, TOP_K, generator=g)
        l13, l2 = blk.bound13.launcher(m), blk.bound2.launcher(m)
        r13, r2 = l13.kernel, l2.kernel
        r13.prefetched.clear()
        r2.prefetched.clear()
        y = blk(x, ids, tw)
        ref = _ref(x, routed, shared, ids, tw)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
        return r13.prefetched, r2.prefetched, l2.weight

    assert call(1)[0] == [None]                                  # off by default
    blk.prefetch_w2, blk.l2_bytes = True, 1 << 30
    got13, got2, w2 = call(1)
    assert len(got13) == 1 and got13[0][0] is w2.packed and got13[0][1] is w2.scales and got2 == [None]
    per = sum(t.numel() * t.element_size() for t in (blk.bound13.launcher(1).weight.packed,
                                                     blk.bound13.launcher(1).weight.scales, w2.packed, w2.scales))
    blk.l2_bytes = per // (E + 1) * 3 * 2                        # room for 3 experts' bytes (half the L2)
    assert call(1)[0][0] is not None and call(2)[0] == [None]    # M = 1 touches <= 3 experts, M = 2 up to 5
    blk.l2_bytes = 1 << 30
    assert call(90)[0] == [None]                                 # 270 pairs: the aligned route, no prefetch
    blk.prefetch_w2 = False
    assert call(1)[0] == [None]


def test_prefetch_w2_reads_its_variable(monkeypatch):
    from autotune.core import settings
    for v, want in (("", False), ("0", False), ("1", True), ("true", True)):
        monkeypatch.setenv(settings.PREFETCH_W2, v)
        assert settings.prefetch_w2() is want
    monkeypatch.setenv(settings.PREFETCH_W2, "yes")
    with pytest.raises(ValueError, match="AUTOTUNE_PREFETCH_W2"):
        settings.prefetch_w2()


# -- scratch_out: w13's h in the dispatcher's pool (no allocation per forward) ------------------------

def test_scratch_out_writes_the_pools_view_and_a_plan_reuses_it():
    from autotune.tactics.scratch import ScratchPool
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    pool = ScratchPool()
    run.attach(pool)
    pool.get(0, f"moe.out.{threading.get_ident()}", 4 * W13.k, torch.bfloat16, "cpu")     # room for an x inside it (below)
    x, ids, tw = _operands(W13, 3, 0)
    y = run(x, w, ids, tw, scratch_out=True)
    buf = pool.bufs[("cpu", 0, f"moe.out.{threading.get_ident()}")]
    assert y.data_ptr() == buf.data_ptr() and y.shape == (3, W13.top_k, W13.out_n)
    assert run.calls[-1][2][3] == buf.data_ptr()                 # the kernel's out pointer
    checks = run.checks
    x2, ids2, tw2 = _operands(W13, 3, 1)
    y2 = run(x2, w, ids2, tw2, scratch_out=True)                 # planned: the same view, no allocation
    assert run.checks == checks and y2 is y
    assert run(x2, w, ids2, tw2).data_ptr() != buf.data_ptr()   # without it: a fresh output (another plan)
    inside = buf[:3 * W13.k].view(3, W13.k)                      # x taken from the scratch output: refused,
    for fresh in (True, False):                                  # the whole way and past a plan alike
        if fresh:
            run._forget()
        with pytest.raises(ValueError, match="overlaps the scratch output"):
            run(inside, w, ids, tw, scratch_out=True)


def _layer(d, seed):
    """A folded FP4MoE layer on dispatcher `d` (tests/test_moe_shared_slot.py's shapes, cudamoecpu pinned)."""
    from autotune.runtime.moe import FP4MoE
    from tests.test_moe_shared_slot import E, H, I, T13, T2, TOP_K
    g = torch.Generator().manual_seed(seed)
    routed = [torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g) * 2, torch.randn(E, H, I, generator=g)]
    shared = [torch.randn(I, H, generator=g) * 0.5, torch.randn(I, H, generator=g), torch.randn(H, I, generator=g)]
    blk = FP4MoE.from_float(*routed, TOP_K, dispatcher=d, shared=FP4MoE.shared_from_float(*shared), fold_shared=True)
    d.pin(blk.problem13, T13)
    d.pin(blk.problem2, T2)
    from autotune.core.formats import quantize
    return blk, [quantize(w) for w in routed], [quantize(w) for w in shared]


def test_two_layers_share_the_scratch_h_and_match_float64(tmp_path, fam):
    """Two folded FP4MoE layers of one dispatcher, the second fed the first's output: w13 writes h into
    the same pool buffer for both (the CPU port NaN-fills it, then writes it as the kernel does), and
    both layers match float64."""
    import warnings

    from autotune.core.arch import ARCHS
    from autotune.core.env import cpu
    from autotune.runtime.dispatch import Dispatcher
    from tests.test_moe_shared_slot import E, H, TOP_K, _ref
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["sm90"], record_misses=False, warn=False)
    (a, ra, sa), (b, rb, sb) = _layer(d, 0), _layer(d, 1)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, H, generator=g).to(torch.bfloat16)
    ids = [torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(3)]).int() for _ in range(2)]
    tw = [torch.rand(3, TOP_K, generator=g) for _ in range(2)]
    ya = a(x, ids[0], tw[0])
    yb = b(ya, ids[1], tw[1])
    r13a, r13b = a.bound13.launcher(3).kernel, b.bound13.launcher(3).kernel
    assert r13a is not r13b and r13a.scratch is r13b.scratch is d.scratch
    assert r13a.scratch_outs == 1 and r13b.scratch_outs == 1 and ("cpu", 0, f"moe.out.{threading.get_ident()}") in d.scratch.bufs
    for y, xin, r, s_, i, t in ((ya, x, ra, sa, ids[0], tw[0]), (yb, ya, rb, sb, ids[1], tw[1])):
        ref = _ref(xin, r, s_, i, t)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


def test_the_scratch_view_is_per_thread_and_an_offset_x_inside_it_is_refused():
    """Two host threads on one stream get two h buffers (h lives from one launch to the next, so two
    threads' layers must not share it), and a plan made on one thread is not used on another; an x
    anywhere inside the view is refused past a plan too, as the whole way refuses it."""
    import threading as T
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    x, ids, tw = _operands(W13, 3, 0)
    mine = run(x, w, ids, tw, scratch_out=True)
    got = {}
    th = T.Thread(target=lambda: got.setdefault("y", run(x, w, ids, tw, scratch_out=True)))
    th.start()
    th.join()
    assert got["y"].data_ptr() != mine.data_ptr()
    assert run(x, w, ids, tw, scratch_out=True).data_ptr() == mine.data_ptr()
    name = f"moe.out.{T.get_ident()}"
    run.scratch.get(0, name, 8 * W13.k, torch.bfloat16, "cpu")     # grown: a new view at the next whole way
    run._forget()
    y = run(x, w, ids, tw, scratch_out=True)
    inside = run.scratch.bufs[("cpu", 0, name)][8:8 + 3 * W13.k].view(3, W13.k)
    with pytest.raises(ValueError, match="overlaps the scratch output"):
        run(inside, w, ids, tw, scratch_out=True)                  # planned form, x at an offset inside
    assert y.data_ptr() == run.scratch.bufs[("cpu", 0, name)].data_ptr()


def test_a_prefetch_pair_is_checked_once_for_every_m_and_bad_x_still_gets_its_own_error(monkeypatch):
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    pf = _pf(W13)
    n = []
    real = MOE.check_prefetch
    monkeypatch.setattr(MOE, "check_prefetch", lambda *a: n.append(1) or real(*a))
    for m in (1, 3, 1, 3, 2):
        x, ids, tw = _operands(W13, m, m)
        run(x, w, ids, tw, prefetch=(pf[0], pf[1]))                # a new tuple each call, the same tensors
    assert len(n) == 1
    x, ids, tw = _operands(W13, 1, 0)
    with pytest.raises(ValueError, match="x must be bf16") as ei:
        run(None, w, ids, tw, prefetch=pf)
    assert "\n" not in str(ei.value)


def test_fp4moe_re_forms_when_the_l2_budget_changes(tmp_path, fam):
    from tests.test_moe_shared_slot import E, H, TOP_K, _block
    blk, _, _ = _block(tmp_path)
    blk.prefetch_w2, blk.l2_bytes = True, 1 << 30
    x = torch.randn(1, H).to(torch.bfloat16)
    ids, tw = torch.tensor([[0, 2]], dtype=torch.int32), torch.rand(1, TOP_K)
    r13 = blk.bound13.launcher(1).kernel
    blk(x, ids, tw)
    assert r13.prefetched[-1] is not None
    blk.l2_bytes = 16                                              # no room: the next call forms anew
    blk(x, ids, tw)
    assert r13.prefetched[-1] is None
