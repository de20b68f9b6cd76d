"""The host's part of one eager FP4MoE forward (issue #26: "eager FP4MoE host time ≤ 40 µs per
forward at M = 1"), on the cuda family's launchers (MoeLaunch for w13/w2, Launch for the shared
expert's FP4MLP), pinned.

* `--device cpu` (default): the real launchers with only the launch (pdl.runner's) replaced by a no-op, so
  what is timed is our Python and the torch ops around the kernels (on CPU tensors: a torch op on
  CUDA costs the host a few µs more).
* `--device cuda`: the real kernels; the loop issues `--batch` forwards and syncs only after it, so
  the figure is host time per forward as long as the GPU keeps up (it does at M = 1: ~30 µs of
  kernels), and the device syncs one forward makes are counted (torch's sync debug mode).

    python3 bench/moe_host.py [--device cpu|cuda] [--experts 16] [--reps 30] [--batch 200] [--profile 15]
                              [--profile-form "shared folded"] [--json out.json]

GLM-5 TP8's MoE layer (H 6144, I 256 per rank, top 8, one shared expert) with `--experts` local
experts (the host path does not depend on E), M = 1, forms: routed only, shared apart, shared folded
(the default), and shared folded with w2 on moe_tok. Figures: µs per forward, p50 / p90 over
batches; this thread's CPU µs per forward, least over batches (time the thread spends off the CPU
on a loaded machine left out); the Python and C function calls one forward makes (sys.setprofile:
the host path's length, the same on any machine); and the torch operators one forward dispatches.
`--profile N` prints the N functions with the most own time (cProfile) for `--profile-form`.
"""
from __future__ import annotations

import cProfile
import io
import platform
import pstats
import sys
import time
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402
from bench.harness import is_sync_warning  # noqa: E402
from bench.eager_cpu import per_call  # noqa: E402  (µs per call, p50 / p90 over batches)

H, I, TOP_K = 6144, 256, 8


def _null(*args, **kw):
    return None


def null_family():
    """The cuda family whose two launchers run every line of theirs but the launch."""
    from autotune.tactics.cuda import launch as LA, moe as MOE
    from autotune.tactics.cuda.family import CudaFamily
    from autotune.tactics.cuda.moe_tok import TokLaunch

    class NullGrouped:                   # both grouped launchers: every check but the CUDA device's, no launch
        def check(self, x, w, topk_ids, topk_weights, out, **shared):
            return MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False, **shared)

        def _run(self, dev):
            return _null

    class NullMoe(NullGrouped, MOE.MoeLaunch):
        pass

    class NullTok(NullGrouped, TokLaunch):
        pass

    class NullDense(LA.Launch):
        def __call__(self, x, w, out):
            real = LA.check_call
            LA.check_call = lambda *a: real(*a, cuda=False)              # the CUDA device's check only
            try:
                return super().__call__(x, w, out)
            finally:
                LA.check_call = real

        def function(self, m_tiles, dev):
            return m_tiles, None

        def _run(self, fn, c, dev):
            return _null

    class NullCuda(CudaFamily):
        name = "cudanull"
        depends_on = ("torch",)

        def available(self, device):
            return True, ""

        def _runner(self, problem, tactic, device):
            from autotune.tactics.cuda.family import config
            return NullDense(problem, tactic, device, config)

        def _moe_runner(self, problem, tactic, device):
            return (NullTok if MOE.is_tok(tactic) else NullMoe)(problem, tactic, device)
    return NullCuda


def aten_ops(fwd) -> int:
    """The torch operators one forward dispatches (each costs host time on a GPU: an allocation, a cat)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fwd()
    return Count.n


def python_calls(fwd) -> int:
    """The Python and C function calls one forward makes (sys.setprofile's call and c_call events)."""
    n = 0

    def count(frame, event, arg):
        nonlocal n
        n += event in ("call", "c_call")
    fwd()
    sys.setprofile(count)
    try:
        fwd()
    finally:
        sys.setprofile(None)
    return n - 1                          # setprofile(None) itself


def cpu_us(fwd, reps: int, batch: int) -> float:
    """This thread's CPU µs per forward, the least over `reps` batches of `batch` forwards."""
    fwd()
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time_ns()
        for _ in range(batch):
            fwd()
        best = min(best, (time.thread_time_ns() - t0) / batch / 1e3)
    return best


EMPTY = r"""extern "C" __global__ void empty_moe(const void* a0, const void* a1, const void* a2, void* a3,
    const void* a4, const void* a5, const void* a6, void* a7, int* a8, int* a9, float* a10, int* a11, int i0, int i1,
    int i2, int i3, int i4, int i5, int i6, int i7, int i8, int i9, int i10, const int* p0, const int* p1, int j0,
    int j1, const char* f0, const char* f1, int k0, int k1) {}"""


def parts(dev: str, reps: int = 20000) -> dict:
    """The host cost of each piece a folded forward repeats (µs per call, best of 5): the output's
    allocation, the capture query, the raw stream read and, on a GPU, one launch of an empty kernel
    with moe_mma's 31 arguments through the family's launch path (pdl.runner: cuLaunchKernelEx on
    sm_90+). Synced after each block of calls, so a launch is timed as the host issues it."""
    import timeit

    import torch
    from autotune.tactics.scratch import stream_key
    d = torch.device(dev, 0) if dev == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def best(fn, n=reps):
        fn()
        sync()
        out = []
        for _ in range(5):
            t = timeit.timeit(fn, number=n)
            sync()
            out.append(t / n * 1e6)
        return round(min(out), 3)
    got = {"torch.empty [1, 9, 256] bf16": best(lambda: torch.empty((1, 9, 256), dtype=torch.bfloat16, device=d)),
           "stream_key (raw current stream)": best(lambda: stream_key(d))}
    if dev == "cuda":
        got["torch.cuda.is_current_stream_capturing"] = best(torch.cuda.is_current_stream_capturing)
        import cupy
        from autotune.tactics.cuda import pdl
        fn = cupy.RawKernel(EMPTY, "empty_moe")
        fn.compile()
        run = pdl.runner(fn, EMPTY, "empty_moe", 0)
        import numpy as np
        args = tuple([torch.zeros(1, device=d).data_ptr()] * 12 + [np.int32(1)] * 11 + [0, 0] + [np.int32(0)] * 2
                     + [0, 0] + [np.int32(0)] * 2)
        s = stream_key(d)
        got[f"empty kernel launch ({type(run).__name__}, 31 arguments)"] = best(
            lambda: run((9, 16, 2), (256, 1, 1), args, s), 5000)
    return got


def pick(fam, problem, arch, split: bool, kernel: str | None = None):
    """A kept tactic of the family for `problem`: with split-K when `split` (as the H200's M = 1
    winners take), else without; of grouped kernel `kernel` where given (moe_mma or moe_tok)."""
    for t in fam.enumerate(problem, arch):
        if kernel is not None and t.params.get("kernel", kernel) != kernel:
            continue
        if (int(t.params.get("split_k", 1)) > 1) == split and fam.verdict(problem, t, arch).ok is not False:
            return t
    raise SystemExit(f"no kept cuda tactic for {problem.key} (split={split})")


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--profile", type=int, default=15)
    ap.add_argument("--profile-form", default="shared folded",
                    choices=("routed only", "shared apart", "shared folded", "shared folded, w2 moe_tok"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.experts < TOP_K:
        ap.error(f"--experts must be at least top_k = {TOP_K}")
    warnings.simplefilter("ignore")
    import torch
    from autotune.core.arch import ARCHS
    from autotune.core.env import cpu
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.moe import FP4MoE
    from autotune.tactics import registry

    dev = a.device
    if dev == "cpu":
        registry.FAMILIES["cudanull"] = f"{__name__}:NullCuda"
        globals()["NullCuda"] = null_family()
        registry.get.cache_clear()
        fam, arch = registry.get("cudanull"), ARCHS["sm90"]
    else:
        from autotune.core.arch import detect
        fam, arch = registry.get("cuda"), detect()
    torch.manual_seed(0)
    e = a.experts
    w13 = (torch.randn(e, 2 * I, H) * 0.02).to(dev)        # quantized where they serve
    w2 = (torch.randn(e, H, I) * 0.02).to(dev)
    shared = tuple((torch.randn(*s) * 0.02).to(dev) for s in ((I, H), (I, H), (H, I)))
    x = torch.randn(1, H).to(torch.bfloat16).to(dev)
    ids = torch.randint(0, e, (1, TOP_K)).to(dev)
    tw = torch.rand(1, TOP_K).to(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    syncs, ops, calls, host_cpu = {}, {}, {}, {}
    rows = {}
    profile = ""
    for form in ("routed only", "shared apart", "shared folded", "shared folded, w2 moe_tok"):
        d = Dispatcher(None, env=cpu(), arch=arch, record_misses=False, warn=False) if dev == "cpu" else \
            Dispatcher(None, record_misses=False, warn=False)
        kw = {} if form == "routed only" else {"shared": FP4MoE.shared_from_float(*shared),
                                               "fold_shared": form.startswith("shared folded")}
        blk = FP4MoE.from_float(w13[:, :I], w13[:, I:], w2, TOP_K, dispatcher=d, **kw)
        for p in [blk.problem13, blk.problem2] + list(getattr(blk.shared_mlp, "problems", ()) if blk.shared_mlp else ()):
            tok = p is blk.problem2 and form.endswith("moe_tok")   # w2:reduce on the token-major kernel
            d.pin(p, pick(fam, p, arch, split=p.n < 2048, kernel="moe_tok" if tok else "moe_mma"))   # split-K where N is small
        fwd = (lambda blk=blk: blk(x, ids, tw))
        fwd()
        sync()
        rows[form] = per_call(fwd, a.reps, a.batch)
        sync()
        ops[form] = aten_ops(fwd)
        calls[form] = python_calls(fwd)
        host_cpu[form] = cpu_us(fwd, a.reps, a.batch)
        sync()
        if dev == "cuda":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fwd()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs[form] = sum(is_sync_warning(w) for w in caught)
        if form == a.profile_form and a.profile:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.batch):
                fwd()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.profile)
            profile = s.getvalue()
    what = "host only (no-op CuPy launch)" if dev == "cpu" else f"real kernels on {torch.cuda.get_device_name()}"
    print(f"FP4MoE eager forward, {what}, M = 1, H {H}, I {I}, top {TOP_K}, "
          f"E {e}, {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print("| form | µs / forward p50 | p90 | thread CPU µs, least | Python calls / forward | aten ops / forward "
          "| syncs / forward |\n|---|---:|---:|---:|---:|---:|---:|")
    for form, r in rows.items():
        print(f"| {form} | {r['p50']:.1f} | {r['p90']:.1f} | {host_cpu[form]:.1f} | {calls[form]} | {ops[form]} "
              f"| {syncs.get(form, '-')} |")
    pieces = parts(dev)
    print("| piece of a forward | µs per call |\n|---|---:|")
    for k, v in pieces.items():
        print(f"| {k} | {v} |")
    if profile:
        print(profile[profile.find("   ncalls"):])
    if a.json:
        harness.write(a, {"rows": rows, "syncs": syncs, "aten_ops": ops, "python_calls": calls, "cpu_us": host_cpu,
                          "parts": pieces, "device": dev, "experts": e, "torch": torch.__version__})


if __name__ == "__main__":
    main()
