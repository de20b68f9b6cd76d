"""The measuring side of a search: one `Bench` holds one (problem, bucket)'s inputs, reference and
built kernels, and answers three requests — setup, check, time.

It runs in-process (`InlineExecutor`) or, by default, in a worker process started with
`python -m autotune.engine.worker` (spawned, never forked, so a parent that initialised CUDA is never
copied). The worker speaks one JSON object per line on its stdin/stdout; anything a kernel or
library prints goes to stderr. After a CUDA error the worker checks whether the context is still
usable and exits when it is not, so one bad tactic costs one worker, not the search.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import zlib
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch

from autotune.core import inputs, layer_inputs as layer_io
from autotune.core.formats import FP4Weight
from autotune.engine import layers, replay as replay_check, timing
from autotune.engine.executor import exit_now
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.base import PLAIN_LAYOUT, Launcher, as_launcher
from autotune.tactics.scratch import ScratchPool

EXIT_POISONED = 3     # the CUDA context is unusable after a tactic's error

#: device bytes a worker may hold past its inputs for kernels it is still timing (their scratch and
#: captured graphs); past it, a tactic's kernel and graph are dropped after each request and rebuilt
#: when it is timed again, so memory stays bounded whatever a tactic's launcher keeps
KEEP_BYTES = 4 << 30


def _random_bytes(shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Uniform random uint8 of `shape` from a CPU generator, drawn as 64-bit words viewed as bytes:
    torch's CPU randint draws one number per element, 11x slower (GLM-5's 404 MB of expert codes:
    40.8 s against 3.6 s on a loaded 2-core machine, 2026-12-07)."""
    n = math.prod(shape)
    words = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-2 ** 63, None, generator=gen)  # all 64 bits
    return words.view(torch.uint8)[:n].reshape(shape)


_OCTAVES: list[torch.Tensor] = []


def seeded_weight(problem: Problem, device: str, seed: int):
    """The job's weight: `inputs.seeded_weight`'s distribution (uniform codes; NVFP4 block scales
    2^(4u - 2), u uniform in [0, 1), never zero; one global scale 1/64 an expert), drawn fast on
    the CPU — codes as 64-bit words, u as 16-bit integers mapped through a 65,536-entry table (one
    float drawn and converted per scale cost 9.1 s for GLM-5's experts, loaded). On a GPU, and for
    MXFP4, `inputs.seeded_weight` itself (a device draw is fast). Kept here, not in core.inputs,
    whose source is part of the torch family's code key."""
    if device != "cpu" or problem.w_fmt != "nvfp4":
        return inputs.seeded_weight(problem, device, seed)
    gen = torch.Generator().manual_seed(seed)
    lead = (problem.experts,) if problem.kind == "grouped_moe" else ()
    packed = _random_bytes(lead + (problem.n, problem.k // 2), gen)
    sshape = lead + (problem.n, problem.k // problem.block)
    if not _OCTAVES:
        u = (torch.arange(1 << 16, dtype=torch.float64) + 0.5) / (1 << 16)
        _OCTAVES.append((2.0 ** (u * 4 - 2)).to(torch.float8_e4m3fn).view(torch.uint8))
    idx = _random_bytes((math.prod(sshape) * 2,), gen).view(torch.int16).int() & 0xFFFF
    scales = _OCTAVES[0].index_select(0, idx).view(torch.float8_e4m3fn).reshape(sshape)
    return FP4Weight(packed, scales, torch.full(lead, 1.0 / 64, dtype=torch.float32), "nvfp4")


def _allocated_fn(device: str) -> Callable[[], int]:
    if device != "cuda":
        return lambda: 0      # host memory is not the limit on the CPU machine
    import torch
    return torch.cuda.memory_allocated


def _nbytes(objs: Iterable) -> int:
    """Bytes of the distinct tensors reachable from `objs` (FP4Weights, packed layouts, tuples)."""
    import torch
    seen: dict[int, int] = {}

    def walk(o, depth: int) -> None:
        if torch.is_tensor(o):
            seen.setdefault(o.data_ptr(), o.untyped_storage().nbytes())
        elif depth < 4 and isinstance(o, (list, tuple, dict)):
            for v in (o.values() if isinstance(o, dict) else o):
                walk(v, depth + 1)
        elif depth < 4 and (hasattr(o, "__dict__") or hasattr(o, "__slots__")):
            names = list(getattr(o, "__dict__", {})) + list(getattr(o, "__slots__", ()))
            for n in names:
                walk(getattr(o, n, None), depth + 1)

    for o in objs:
        walk(o, 0)
    return sum(seen.values())


#: past this many bytes left after a job beyond its weights and packs, the job's reply names the
#: largest live device tensors and what holds them (the summary reports the worst job)
LEFT_BYTES = 256 << 20


@contextmanager
def unfrozen() -> Iterator[None]:
    """gc.get_objects() and gc.get_referrers() leave out what `collect_young` froze (a tensor a job
    left behind is frozen by the time it is looked for): inside, they see everything."""
    import gc
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        yield
    finally:
        if frozen:
            gc.freeze()


def live_tensors(n: int = 4) -> list[str]:
    """The n largest device tensors alive, each with the types of the objects that refer to it."""
    import gc
    import torch
    found = {}
    with unfrozen():
        for o in gc.get_objects():
            try:
                if torch.is_tensor(o) and o.is_cuda:
                    found.setdefault(o.untyped_storage().data_ptr(), o)
            except Exception:
                continue
        big = sorted(found.values(), key=lambda t: -t.untyped_storage().nbytes())[:n]
        return [f"{tuple(t.shape)} {t.dtype} {t.untyped_storage().nbytes()} B held by "
                + ", ".join(sorted({type(r).__name__ for r in gc.get_referrers(t)} - {"list", "frame"}))[:200]
                for t in big]


def is_oom(e: BaseException) -> bool:
    import torch
    return isinstance(e, torch.OutOfMemoryError)


def collect_young() -> None:
    """A full collection, then everything that survived it frozen (gc.freeze): the next one walks
    only what was made since. A worker's heap is torch's and Triton's;
    collecting it at every job's end took ~140 ms on the H100 (34.5 s of the first 507 s of the
    main job of 2026-12-05). Frozen objects are still freed by reference counting; only a cycle among them
    waits for `thaw` (called when the problem changes, so its weights and packs go)."""
    import gc
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Let the next collection walk everything again (after the problem's weights were dropped)."""
    import gc
    gc.unfreeze()


class Bench:
    """Inputs, reference and kernels of the current (problem, bucket).

    What it keeps on purpose across the buckets of a problem: the random weights and their packed
    layouts (a bound layer packs once at load). Everything tactic-sized — built kernels with their
    scratch, captured graphs — lives at most until the end of its job (`end_job`), is dropped as soon
    as the search drops the tactic (`forget`), and while more than `keep_bytes` are held past the
    inputs it is dropped after every request."""

    def __init__(self, device: str, keep_bytes: int = KEEP_BYTES, allocated: Callable[[], int] | None = None,
                 freeze: bool = False):
        self.device = device
        self.freeze = freeze and device == "cuda"   # a worker process's own: never a host program's gc
        self.keep_bytes = keep_bytes
        self._allocated = allocated or _allocated_fn(device)
        self.problem: Problem | None = None
        self.bucket = 0
        self.seed = 0
        self._kernels: dict[str, Launcher] = {}   # tactic id -> kernel, this job
        self._weights: list = []                # the problem's random weights, kept across its buckets
        self._graphs: dict[str, dict] = {}      # tactic id -> time_calls memo (its captured graph), this job
        self._packs: dict[tuple[str, int, int], object] = {}  # (layout, set, argument) -> that weight packed, this problem
        self._sets: list = []
        self._outs: list = []
        self._ref = None
        self._replay_refs: replay_check.Refs | None = None   # the replay check's refreshed inputs and references, this job
        self._base = 0                          # bytes held once the job's inputs are drawn
        self._named_live = False                # a job left too much once: its live tensors were named
        self._abandoned = dict(timing.ABANDONED)   # at the last end_job

    # -- memory
    def forget(self, tactic_id: str) -> None:
        """Drop a tactic's kernel (its launcher's scratch with it) and captured graph."""
        self._graphs.pop(tactic_id, None)
        k = self._kernels.pop(tactic_id, None)
        if k is not None:
            k.release()

    def _forget_all(self) -> None:
        for tid in list(self._kernels) + list(self._graphs):
            self.forget(tid)

    def _free(self, release_cache: bool = True) -> None:
        """Collect what was dropped; with release_cache, also hand the allocator's cached blocks back
        to the device (after an out-of-memory: the retry may need another size). Between jobs the
        allocator's cache is left alone: it reuses those blocks and empties itself before failing."""
        if self.device == "cuda":
            import gc
            import torch
            # a launcher in a reference cycle would keep its scratch until the next collection; after an
            # out-of-memory everything is walked (and nothing of the job in flight frozen)
            if release_cache or not self.freeze:
                if self.freeze:
                    thaw()
                gc.collect()
            else:
                collect_young()
            if release_cache:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    def clear(self) -> None:
        """Drop everything, the problem's weights and packs too, and hand the allocator's cache back."""
        self._forget_all()
        self.problem, self._weights, self._sets, self._outs, self._ref = None, [], [], [], None
        self._replay_refs = None
        self._packs.clear()
        self._free()

    def _trim(self, tactic_id: str) -> None:
        if self._allocated() - self._base > self.keep_bytes:
            self.forget(tactic_id)

    def kept_bytes(self) -> int:
        """What the worker keeps on purpose between jobs: the problem's weights and packs."""
        return _nbytes(self._weights) + _nbytes(self._packs.values())

    def end_job(self) -> dict:
        """The job is over: drop every kernel, graph and input of it. Returns the device bytes still
        allocated (should be about `kept` — the problem's weights and packs), what is kept on purpose,
        and the job's peak."""
        t0 = time.perf_counter()
        self._forget_all()
        self._sets = self._outs = []
        self._ref = self._replay_refs = None
        t1 = time.perf_counter()
        self._free(release_cache=False)
        t2 = time.perf_counter()
        out = {"allocated": self._allocated(), "kept": self.kept_bytes(), "peak": 0}
        # captures that failed in this job (timed eagerly instead), and how many of their pools went back
        now = dict(timing.ABANDONED)
        for name, key in (("captures_failed", "captures"), ("pools_released", "released"), ("pools_kept", "kept")):
            out[name] = now[key] - self._abandoned[key]
        self._abandoned = now
        if self.device == "cuda":
            import torch
            out["peak"] = torch.cuda.max_memory_allocated()
            # what the allocator holds, cached blocks and graph pools too: a leak shows here, not in `peak`
            out["reserved"], out["peak_reserved"] = torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            if out["allocated"] - out["kept"] > LEFT_BYTES and not self._named_live:
                self._named_live = True      # once per worker: walking the heap costs ~0.3 s
                out["live"] = live_tensors()
        out["parts"] = {"drop": t1 - t0, "collect": t2 - t1, "figures": time.perf_counter() - t2}
        return out

    # -- requests
    def setup(self, problem_key: str, bucket: int, seed: int) -> dict:
        p = layer_io.parse_key(problem_key)
        io = layer_io if p.kind == layer_io.KIND else inputs     # a whole MoE layer's inputs, or one GEMM's
        self._forget_all()                  # nothing of the last job outlives it, whatever the caller did
        if p != self.problem:
            if self.freeze:
                thaw()                      # the old problem's weights and packs, frozen with the jobs, may go
            self._weights = []
            self._packs.clear()         # packs of the weights just dropped; set i keeps weight i across buckets
        self._sets = self._outs = []    # drop the last bucket's tensors before drawing the next
        self._ref = self._replay_refs = None
        self.problem, self.bucket, self.seed = p, bucket, seed
        try:
            # seeds from crc32: stable across processes, unlike hash()
            t0 = time.perf_counter()
            n_sets = timing.sets_for_cold_l2(io.set_bytes(p, bucket), self.device)
            draw = seeded_weight if io is inputs else io.seeded_weight    # one GEMM's: fast on the CPU
            for i in range(len(self._weights), n_sets):
                self._weights.append(draw(p, self.device, zlib.crc32(f"{seed}:{p.key}:w{i}".encode())))
            t1 = time.perf_counter()
            s0 = zlib.crc32(f"{seed}:{p.key}:{bucket}".encode())
            self._sets = io.make_inputs(p, bucket, self.device, s0, n_sets, weights=self._weights)
            t2 = time.perf_counter()
            if io is inputs:
                # set 0's reference (the eager check's) and the replay check's second seed with its
                # reference, made in one pass: a grouped problem's experts dequantized once for both
                self._replay_refs = replay_check.draw(p, bucket, self.device, seed, self._sets[0].w,
                                                      known=(self._sets[0], None))
                self._ref = self._replay_refs.refs[0]
            else:          # a whole MoE layer: its replay check draws its own second seed (engine/layers.py)
                self._ref = io.reference(p, self._sets[0])
            self._outs = [io.torch_empty_out(p, bucket, s) for s in self._sets]
        except BaseException:
            self.clear()      # the caller retries with the same seeds: give it the whole device back first
            raise
        self._base = self._allocated()
        # weights: drawn once a problem (0 s for its later buckets); references: set 0's and the replay seed's
        return {"sets": len(self._sets), "parts": {"weights": t1 - t0, "inputs": t2 - t1,
                                                   "references": time.perf_counter() - t2}}

    def _kernel(self, tactic: Tactic):
        k = self._kernels.get(tactic.id)
        if k is None:
            k = self._kernels[tactic.id] = as_launcher(registry.get(tactic.family).build(self.problem, tactic, self.device))
        return k

    def _args(self, tactic: Tactic, i: int) -> tuple:
        """Set i's arguments with the weights in the tactic's layout (one GEMM's weight; a whole MoE
        layer's w13 and w2), packed once per problem (set i uses the problem's weights i in every
        bucket) as a bound layer packs them at load: a layout's packing never runs inside a timed
        call (or a captured graph)."""
        args = self._sets[i].args()
        fam = registry.get(tactic.family)
        lay = fam.layout(tactic)
        if lay == PLAIN_LAYOUT:
            return args
        at = (1, 2) if self.problem.kind == layer_io.KIND else (1,)
        packed = list(args)
        for j in at:
            w = self._packs.get((lay, i, j))
            if w is None:
                w = self._packs[(lay, i, j)] = fam.pack(lay, args[j])
            packed[j] = w
        return tuple(packed)

    def _retry_oom(self, tactic: Tactic, fn: Callable[[], dict]) -> dict:
        """One request; out of device memory, every other tactic's kernel and graph is dropped and it
        runs once more, so an OOM is the tactic's own only when it happens with the job's inputs alone."""
        try:
            out = fn()
        except Exception as e:
            if not is_oom(e):
                raise
            self._forget_all()
            self._free()
            try:
                out = fn()
            except Exception as e2:
                if is_oom(e2):
                    self.forget(tactic.id)
                    self._free()
                    raise RuntimeError(f"{error_text(e2)} (with every other tactic's memory freed)") from e2
                raise
        self._trim(tactic.id)
        return out

    def check(self, tactic: Tactic) -> dict:
        """Build (compiling if needed) and compare one call against the float64 reference."""
        def run() -> dict:
            t0 = time.perf_counter()
            kernel = self._kernel(tactic)
            t1 = time.perf_counter()
            args = self._args(tactic, 0)          # set 0's, its weights packed
            t2 = time.perf_counter()
            call = [0.0]

            def timed_call(*_given, out=None):
                # the call's host time: a kernel compiled or loaded at its first launch shows here
                c0 = time.perf_counter()
                try:
                    return kernel(*args, out=out)
                finally:
                    call[0] = time.perf_counter() - c0
            err = inputs.check(self.problem, timed_call, self._sets[0], self._ref)
            return {"rel_err": err, "smem_compiled": kernel.smem_compiled,
                    "parts": {"build": t1 - t0, "pack": t2 - t1, "run": time.perf_counter() - t2,
                              "call": call[0]}}
        return self._retry_oom(tactic, run)

    def replay(self, tactic: Tactic) -> dict:
        """The replay check (autotune.engine.replay): the tactic bound as an engine binds it (set 0's
        weight, packed as the search packed it; a scratch pool and bad-id word attached), called as
        an engine calls it, captured, and replayed with inputs refreshed in place. Raises
        ReplayFailed when it is wrong there. The refreshed inputs and their float64 references are
        drawn once per (problem, bucket), with the job's inputs (`setup`): the job's set 0 with the
        reference its eager check uses, and one more seed; every finalist's check shares them."""
        if self.problem.kind == layer_io.KIND:     # a whole MoE layer: built, not bound (engine/layers.py)
            return self._retry_oom(tactic, lambda: layers.replay(self.problem, self._kernel(tactic), self.bucket,
                                                                 self.device, self.seed, (self._sets[0], self._ref),
                                                                 self._args(tactic, 0)[1:3]))

        def run() -> dict:
            t0 = time.perf_counter()
            packed = self._args(tactic, 0)[1]
            if self._replay_refs is None:
                self._replay_refs = replay_check.draw(self.problem, self.bucket, self.device, self.seed,
                                                      self._sets[0].w, known=(self._sets[0], self._ref))
            t1 = time.perf_counter()
            pool = ScratchPool()
            word = pool.word(self.device, tactic.id)
            launcher = as_launcher(registry.get(tactic.family).bind(self.problem, tactic, packed, self.device))
            try:
                launcher.attach(pool, word)
                t2 = time.perf_counter()
                r = replay_check.check(self.problem, launcher, self._replay_refs, self.device, pool, word)
            finally:
                launcher.release()
                pool.clear()
            return {"max_row_err": r.max_row_err, "mode": r.mode, "replays": r.replays,
                    "parts": {"draw": t1 - t0, "bind": t2 - t1, "run": time.perf_counter() - t2}}
        return self._retry_oom(tactic, run)

    def time(self, tactic: Tactic, timer: timing.TimerConfig) -> dict:
        """Time one tactic; its parts: "first" (the tactic's first timing in the job: warm-up and
        capture included) or "again" (a later halving round: the captured graph replayed)."""
        def run() -> dict:
            t0 = time.perf_counter()
            kernel = self._kernel(tactic)
            sets, outs = self._sets, self._outs
            memo = self._graphs.setdefault(tactic.id, {})   # later halving rounds replay the graph captured at the start
            first = not memo
            # packed before any timing or capture; a captured graph holds its arguments already
            args = [self._args(tactic, i) for i in range(len(sets))] if "graph" not in memo else []
            if first and self.problem.kind == layer_io.KIND:
                for i in range(1, len(sets)):    # a layer launcher packs each set's weights at its first
                    kernel(*args[i], out=outs[i])  # call (the check made set 0's): never inside a capture
            t = timing.time_calls(lambda i: kernel(*args[i], out=outs[i]), len(sets), self.device, timer, memo)
            return {"median_us": t.median_us, "iqr_us": t.iqr_us, "reps": t.reps,
                    "parts": {"first" if first else "again": time.perf_counter() - t0}}
        return self._retry_oom(tactic, run)


def context_usable(device: str) -> bool:
    """False when the CUDA context is poisoned (illegal address / instruction are sticky)."""
    if device != "cuda":
        return True
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def handle(b: Bench, msg: dict) -> dict:
    op = msg["op"]
    if op == "setup":
        return b.setup(msg["problem"], msg["bucket"], msg["seed"])
    if op == "check":
        return b.check(Tactic.from_json(msg["tactic"]))
    if op == "replay":
        return b.replay(Tactic.from_json(msg["tactic"]))
    if op == "time":
        return b.time(Tactic.from_json(msg["tactic"]), timing.TimerConfig(**msg["timer"]))
    if op == "forget":
        for tid in msg["tactics"]:
            b.forget(tid)
        return {}
    if op == "end_job":
        return b.end_job()
    if op == "ping":
        return {"pid": os.getpid()}
    raise ValueError(f"unknown request {op!r}")


def error_text(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"[:500]


def main() -> int:
    # The protocol owns the real stdout; everything else printed goes to stderr.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    hello = json.loads(sys.stdin.readline() or "{}")
    for name, path in hello.get("families", {}).items():   # test-only families, registered by path
        registry.FAMILIES.setdefault(name, path)
    b = Bench(hello.get("device", "cpu"), freeze=True)
    proto.write(json.dumps({"ok": True, "ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            reply = {"ok": True, **handle(b, msg)}
        except Exception as e:   # a failing tactic is an answer, not a crash of the worker
            reply = {"ok": False, "error": error_text(e)}
            if not context_usable(b.device):
                reply["poisoned"] = True
                proto.write(json.dumps(reply) + "\n")
                return EXIT_POISONED
        proto.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    exit_now(main())
