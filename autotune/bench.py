"""Inputs, the output check and the timers.

Two timers share one interface (`time_calls`): CUDA events around each call, or around the
replay of a CUDA graph of many calls when a call is short (on an H200 one launch timed alone
carries 15–20 µs of host latency, which would hide every kernel difference at decode sizes);
and perf_counter on the CPU. Both rotate through input sets that together exceed twice the L2,
so weights are read from DRAM as they are in serving, warm up first and keep the median and
IQR. Inputs are random (never zeros), drawn fresh per (problem, bucket).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from autotune.problem import Problem

#: relative Frobenius error allowed against the float64 reference, per output dtype
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 1e-4}
OUT_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class CheckFailed(Exception):
    """A tactic computed the wrong thing (or left outputs unwritten)."""


@dataclass(frozen=True)
class Timing:
    median_us: float
    iqr_us: float
    reps: int


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 0             # extra calls before timing (the check call already warmed up)
    min_reps: int = 3
    max_reps: int = 100
    budget_s: float = 0.25      # per tactic, after the first timed repetition
    graph_below_us: float = 1000.0  # CUDA: calls faster than this are timed as graph replays (host launch cost excluded)
    graph_calls: int = 32


@dataclass
class InputSet:
    x: torch.Tensor
    w: object                   # FP4Weight
    topk_ids: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None

    def args(self) -> tuple:
        if self.topk_ids is None:
            return (self.x, self.w)
        return (self.x, self.w, self.topk_ids, self.topk_weights)

    def nbytes(self) -> int:
        t = [self.x, self.w.packed, self.w.scales]
        if self.topk_ids is not None:
            t += [self.topk_ids, self.topk_weights]
        return sum(a.numel() * a.element_size() for a in t)


def random_weight(problem: Problem, device: str, gen: torch.Generator):
    """A random FP4 weight: uniform codes, scales spread over a few octaves, never zeros."""
    from autotune.formats import FP4Weight
    lead = (problem.experts,) if problem.kind == "grouped_moe" else ()
    packed = torch.randint(0, 256, lead + (problem.n, problem.k // 2), dtype=torch.uint8, generator=gen)
    sshape = lead + (problem.n, problem.k // problem.block)
    if problem.w_fmt == "nvfp4":
        scales = (2.0 ** (torch.rand(sshape, generator=gen) * 4 - 2)).to(torch.float8_e4m3fn)
        gscale = torch.tensor(1.0 / 64, dtype=torch.float32)
    else:
        scales = torch.randint(122, 127, sshape, dtype=torch.uint8, generator=gen)
        gscale = torch.tensor(1.0, dtype=torch.float32)
    return FP4Weight(packed.to(device), scales.to(device), gscale.to(device), problem.w_fmt)


def routing(m: int, experts: int, top_k: int, gen: torch.Generator, skew: float = 1.2):
    """Top-k expert ids per token from a Zipf-like popularity (realistic, not uniform)."""
    pop = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** skew
    pop = pop[torch.randperm(experts, generator=gen)]
    ids = torch.multinomial(pop.expand(m, experts), top_k, replacement=False, generator=gen)
    w = torch.rand(m, top_k, generator=gen, dtype=torch.float32) + 0.1
    return ids.to(torch.int32), (w / w.sum(1, keepdim=True))


def make_inputs(problem: Problem, m: int, device: str, seed: int, n_sets: int = 1) -> list[InputSet]:
    gen = torch.Generator().manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        x = torch.randn(m, problem.k, generator=gen).to(torch.bfloat16).to(device)
        w = random_weight(problem, device, gen)
        if problem.kind == "grouped_moe":
            ids, tw = routing(m, problem.experts, problem.top_k, gen)
            sets.append(InputSet(x, w, ids.to(device), tw.to(device)))
        else:
            sets.append(InputSet(x, w))
    if problem.a_fmt == "nvfp4":
        # W4A4: the static activation scale a ModelOpt checkpoint carries, amax / (6 · 448)
        from autotune.formats import FP4Weight
        for st in sets:
            amax = st.x.float().abs().amax() if st.x.numel() else torch.zeros((), device=st.x.device)
            isc = torch.where(amax > 0, amax / (6.0 * 448.0), torch.ones_like(amax)).float().reshape(())
            st.w = FP4Weight(st.w.packed, st.w.scales, st.w.global_scale, st.w.fmt, isc)
    return sets


def quantize_activations(problem: Problem, x: torch.Tensor, w):
    """x quantized to the problem's FP4 activation format by the torch reference (autotune.formats),
    as an FP4Weight: NVFP4 under the weight's input_scale (1.0 when it has none), MXFP4 as is."""
    from autotune.formats import FP4Weight, quantize, quantize_activation_nvfp4
    if problem.a_fmt == "nvfp4":
        isc = w.input_scale if w.input_scale is not None else torch.ones((), device=x.device)
        isc = isc.float().reshape(()).to(x.device)
        q, sc = quantize_activation_nvfp4(x, isc)
        return FP4Weight(q, sc, isc, "nvfp4")
    return quantize(x, problem.a_fmt)


def activations(problem: Problem, s: InputSet) -> torch.Tensor:
    """x as the kernel multiplies it, in float64: as is for bf16 activations, quantized then
    dequantized for a W4A4 problem — the quantization error is the problem's, not the kernel's."""
    if problem.a_fmt == "bf16":
        return s.x.double()
    return quantize_activations(problem, s.x, s.w).dequantize(torch.float64)


def sets_for_cold_l2(bytes_per_set: int, device: str, cap: int = 64) -> int:
    """How many input sets make the rotation at least twice the L2 (1 on the CPU)."""
    if device != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    return max(1, min(cap, math.ceil(2 * l2 / max(1, bytes_per_set))))


def out_shape(problem: Problem, m: int) -> tuple[int, ...]:
    return (m, problem.top_k, problem.n) if problem.kind == "grouped_moe" else (m, problem.n)


def reference(problem: Problem, s: InputSet) -> torch.Tensor:
    """float64 dequantize-then-matmul, on the inputs' device (activations quantized first for W4A4)."""
    x = activations(problem, s)
    if problem.kind == "dense":
        return x @ s.w.dequantize(torch.float64).T
    m, top_k = s.topk_ids.shape
    out = torch.zeros(m, top_k, problem.n, dtype=torch.float64, device=x.device)
    for e in torch.unique(s.topk_ids).tolist():
        rows, slots = torch.nonzero(s.topk_ids == e, as_tuple=True)
        y = x[rows] @ s.w.expert(e).dequantize(torch.float64).T
        out[rows, slots] = y * s.topk_weights[rows, slots, None].double()
    return out


def check(problem: Problem, kernel: Callable, s: InputSet, ref: torch.Tensor) -> float:
    """Run once into a NaN-filled buffer; return the relative error or raise CheckFailed."""
    out = torch.full(ref.shape, float("nan"), dtype=OUT_DTYPE[problem.out_dtype], device=s.x.device)
    got = kernel(*s.args(), out=out)
    if got is not None and got is not out:
        out.copy_(got)
    if s.x.is_cuda:
        torch.cuda.synchronize()
    unwritten = int(torch.isnan(out).sum())
    if unwritten:
        raise CheckFailed(f"{unwritten} of {out.numel()} outputs not written (or NaN)")
    diff = (out.double() - ref).norm()
    scale = ref.norm()
    err = float(diff / scale) if scale > 0 else float(diff)
    tol = TOLERANCE[problem.out_dtype]
    if not math.isfinite(err) or err > tol:
        raise CheckFailed(f"relative error {err:.3g} > {tol:g} against the float64 reference")
    return err


def _summary(samples_us: Sequence[float]) -> Timing:
    s = sorted(samples_us)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = s[-1] - s[0]
    return Timing(statistics.median(s), iqr, len(s))


def time_calls(call: Callable[[int], object], n_sets: int, device: str, cfg: TimerConfig = TimerConfig()) -> Timing:
    """Time call(i) (i = input set to use) and return median/IQR in microseconds."""
    if device == "cuda":
        return _time_cuda(call, n_sets, cfg)
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


def _time_cuda(call: Callable[[int], object], n_sets: int, cfg: TimerConfig) -> Timing:
    for i in range(max(1, cfg.warmup)):
        call(i % n_sets)
    torch.cuda.synchronize()
    # Estimate one call with events to choose between eager and graph timing.
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    call(0)
    b.record()
    b.synchronize()
    est_us = a.elapsed_time(b) * 1e3
    if est_us < cfg.graph_below_us:
        try:
            return _time_graph(call, n_sets, cfg)
        except RuntimeError:  # not capturable (host syncs inside): time it eagerly
            torch.cuda.synchronize()
    samples: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(samples) < cfg.max_reps:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call(i % n_sets)
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
        i += 1
        if len(samples) >= cfg.min_reps and time.perf_counter() - start > cfg.budget_s:
            break
    return _summary(samples)


def _time_graph(call: Callable[[int], object], n_sets: int, cfg: TimerConfig) -> Timing:
    """Capture cfg.graph_calls calls (rotating input sets) in one graph; time replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            call(i % n_sets)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(cfg.graph_calls):
            call(i % n_sets)
    g.replay()
    torch.cuda.synchronize()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < cfg.max_reps:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / cfg.graph_calls)
        if len(samples) >= cfg.min_reps and time.perf_counter() - start > cfg.budget_s:
            break
    return _summary(samples)


def torch_empty_out(problem: Problem, m: int, s: InputSet) -> torch.Tensor:
    """A preallocated output for timing (the check poisons its own buffer)."""
    return torch.empty(out_shape(problem, m), dtype=OUT_DTYPE[problem.out_dtype], device=s.x.device)
