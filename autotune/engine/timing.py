"""The timers of a search: CUDA events or CUDA-graph replays on the GPU, perf_counter on the CPU.

Both share one interface (`time_calls`). On CUDA, events around each call, or around the replay
of a CUDA graph when a call is short (on an H200 one launch timed alone carries 15–20 µs of host
latency, which would hide every kernel difference at decode sizes), with a spin kernel queued
ahead of each sample so the host's launch latency stays outside it (a graph's samples are queued
back to back and read after one synchronize per batch: as many as make the median precise to
`TimerConfig.precision`, judged from the first samples' spread, never more than fit the budget);
on the CPU, perf_counter.
Both rotate through input sets (autotune.core.inputs) that together exceed twice the L2 — a graph
holds one call per set, so every replay reads the whole rotation — so weights come from DRAM as
they do in serving; both warm up first and keep the median and IQR.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from autotune.engine.options import TimerConfig  # noqa: F401  (declared with every other knob)


@dataclass(frozen=True)
class Timing:
    median_us: float
    iqr_us: float
    reps: int


def sets_for_cold_l2(bytes_per_set: int, device: str, cap: int = 256) -> int:
    """How many input sets make the rotation at least twice the L2 (1 on the CPU)."""
    if device != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    return max(1, min(cap, math.ceil(2 * l2 / max(1, bytes_per_set))))


def _summary(samples_us: Sequence[float]) -> Timing:
    s = sorted(samples_us)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = s[-1] - s[0]
    return Timing(statistics.median(s), iqr, len(s))


def time_calls(call: Callable[[int], object], n_sets: int, device: str, cfg: TimerConfig = TimerConfig(),
               memo: dict | None = None) -> Timing:
    """Time call(i) (i = input set to use) and return median/IQR in microseconds.

    `memo`, a dict the caller keeps per call (same kernel, same inputs), remembers how the call
    was timed — the captured CUDA graph, or that it runs eagerly — so later timings of it (the
    rounds of successive halving) replay that graph instead of capturing a new one."""
    if device == "cuda":
        return _time_cuda(call, n_sets, cfg, {} if memo is None else memo)
    for i in range(cfg.warmup):
        call(i % n_sets)
    samples: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(samples) < cfg.max_reps:
        t0 = time.perf_counter()
        call(i % n_sets)
        samples.append((time.perf_counter() - t0) * 1e6)
        i += 1
        if len(samples) >= cfg.min_reps and time.perf_counter() - start > cfg.budget_s:
            break
    return _summary(samples)


def _lead(cfg: TimerConfig) -> None:
    """Keep the GPU busy for about cfg.lead_us (at ~2 GHz) so the sample's start event and its
    work are queued before the GPU reaches them: the host's launch latency stays outside."""
    if cfg.lead_us > 0:
        torch.cuda._sleep(int(cfg.lead_us * 2000))


def _time_cuda(call: Callable[[int], object], n_sets: int, cfg: TimerConfig, memo: dict) -> Timing:
    if "graph" in memo:
        return _replay(memo["graph"], cfg)
    if not memo.get("eager"):
        for i in range(max(1, cfg.warmup)):
            call(i % n_sets)
        torch.cuda.synchronize()
        est_us = 0.0
        if math.isfinite(cfg.graph_below_us):   # estimate one call with events to choose
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call(0)
            b.record()
            b.synchronize()
            est_us = a.elapsed_time(b) * 1e3
        if est_us < cfg.graph_below_us:
            try:
                memo["graph"] = _capture(call, n_sets, cfg)
                return _replay(memo["graph"], cfg)
            except RuntimeError:  # not capturable (host syncs inside), or out of memory inside the capture
                # (a capture cannot free cached blocks; large calls, where launch latency does not
                # matter): time it eagerly
                torch.cuda.synchronize()
        memo["eager"] = True
    samples: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(samples) < cfg.max_reps:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _lead(cfg)
        a.record()
        call(i % n_sets)
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
        i += 1
        if len(samples) >= cfg.min_reps and time.perf_counter() - start > cfg.budget_s:
            break
    return _summary(samples)


def _capture(call: Callable[[int], object], n_sets: int, cfg: TimerConfig) -> tuple:
    """One call per input set (up to cfg.max_graph_calls) captured in one graph: (graph, calls).
    A replay then reads the whole rotation once, so no call finds its weights in the L2."""
    calls = max(1, min(n_sets, cfg.max_graph_calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            call(i % n_sets)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    # the pool named up front: a graph whose capture failed will not tell its own (CUDAGraph::pool()
    # refuses before the capture ended)
    pool, prev = torch.cuda.graph_pool_handle(), torch.cuda.current_stream()
    try:
        with torch.cuda.graph(g, pool=pool):
            for i in range(calls):
                call(i)
    except BaseException:
        # torch.cuda.graph's __exit__ leaves its capture stream current when capture_end raises
        torch.cuda.set_stream(prev)
        abandon(g, pool)
        raise
    return g, calls


#: captures that failed in this process; of them, pools `abandon` handed back, and pools it could not
#: (kept: reserved for the life of the process)
ABANDONED = {"captures": 0, "released": 0, "kept": 0}


def abandon(g: "torch.cuda.CUDAGraph", pool: tuple) -> str:
    """Hand back `pool`, the private memory pool of a capture of `g` that failed (a host sync inside
    it). PyTorch's capture_end raises at cudaStreamEndCapture, before it ends the allocator's routing
    into the pool, and a graph whose capture never ended does not release its pool when it dies:
    every block the capture took stays reserved, out of every later allocation's reach, for the life
    of the process (empty_cache cannot free it). The main job on an 80 GB H100 lost two jobs and 22
    trials to that (2026-12-05, docs/search.md#worker-memory). Ending the routing and releasing the pool makes those
    blocks free again. Returns "released"; "owned" when capture_end got past the routing and ended
    (an error in the captured code that left the capture valid, e.g. an out-of-memory: the graph
    owns its pool and releases it when it dies); "kept" when the pool could not be handed back
    (capture_end failed after the routing ended, or PyTorch lacks the calls: counted, and the worker
    ends after the job)."""
    ABANDONED["captures"] += 1
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    dev = torch.cuda.current_device()
    try:
        if end is None:
            raise RuntimeError("no _cuda_endAllocateToPool")
        end(dev, pool)
    except Exception:         # not routing into it any more: capture_end got that far
        try:
            g.pool()          # raises unless the capture ended: then the graph releases the pool
            return "owned"
        except Exception:
            ABANDONED["kept"] += 1
            return "kept"
    try:
        if release is None:
            raise RuntimeError("no _cuda_releasePool")
        release(dev, pool)
    except Exception:         # never in the way of the capture's own error
        ABANDONED["kept"] += 1
        return "kept"
    ABANDONED["released"] += 1
    return "released"


def _replay(captured: tuple, cfg: TimerConfig) -> Timing:
    """Time replays of a captured graph, per call; one untimed replay first (a new graph's upload).
    The samples are queued back to back, each behind the spin kernel of `_lead` (the host queues
    the next replay while the GPU spins, so its launch latency stays outside every sample), and
    read after one synchronize per batch — a synchronize per sample would double a decode-size
    sample's cost (the GPU idles while the host wakes and queues). The first batch is
    cfg.min_reps samples; their median sizes what the budget allows (`samples_for`). With
    cfg.precision, a second batch brings the samples to `FIRST_SAMPLES` (within the budget) and
    their spread says how many make the median that precise (`precise_for`): the run stops there,
    not when the budget is spent."""
    g, calls = captured
    g.replay()
    torch.cuda.synchronize()
    got = _queued(g, calls, max(1, cfg.min_reps), cfg)
    n = samples_for(statistics.median(got) * calls, cfg)
    if cfg.precision > 0:
        got += _queued(g, calls, min(n, FIRST_SAMPLES) - len(got), cfg)
        n = min(n, max(len(got), cfg.min_reps, precise_for(got, cfg.precision)))
    got += _queued(g, calls, n - len(got), cfg)
    return _summary(got)


def _queued(g: "torch.cuda.CUDAGraph", calls: int, n: int, cfg: TimerConfig) -> list[float]:
    """n replays of g queued back to back, each behind `_lead`; their times per call, in µs."""
    events = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _lead(cfg)
        a.record()
        g.replay()
        b.record()
        events.append((a, b))
    if events:
        events[-1][1].synchronize()
    return [a.elapsed_time(b) * 1e3 / calls for a, b in events]


def samples_for(est_us: float, cfg: TimerConfig) -> int:
    """How many graph-replay samples fit cfg.budget_s at `est_us` a replay (the spin kernel of
    `_lead` added to each), within [cfg.min_reps, cfg.max_reps]; an unbounded budget (a count-bound
    timer: min_reps = max_reps) gives cfg.max_reps."""
    per_us = max(est_us, 1e-3) + max(cfg.lead_us, 0.0)
    fit = cfg.budget_s * 1e6 / per_us
    return int(min(cfg.max_reps, max(cfg.min_reps, math.ceil(fit) if math.isfinite(fit) else cfg.max_reps)))


#: samples a precision-stopped run takes before it judges its spread (within the budget)
FIRST_SAMPLES = 5
#: the standard error of the median of n normal samples is SE_PER_IQR * IQR / sqrt(n)
SE_PER_IQR = 1.2533 / 1.349


def precise_for(samples_us: Sequence[float], precision: float) -> int:
    """How many samples make the median's standard error `precision` of the median, judged from
    these samples' spread (their IQR, or their range under four samples, as a normal one's)."""
    t = _summary(samples_us)
    if t.median_us <= 0 or precision <= 0:
        return len(samples_us)
    return math.ceil((SE_PER_IQR * t.iqr_us / (precision * t.median_us)) ** 2)
