"""The replay check: a tactic run as an engine serves it, under graph replay, before it may win.

A trial's eager check calls the built kernel once with `out=` on fresh tensors. An engine does
something else: it binds the launcher once (`Family.bind`, the dispatcher's scratch pool and
bad-id word attached), calls it with `out=None` (FP4Linear, FP4MLP, FP4MoE; a grouped launcher
with scratch outputs writes its output there), so its second and later calls take the launcher's
repeat path (cached plans, pointers, aligned routes), and captures those calls in a CUDA graph
whose replays see new activations and routes written *in place* under the captured pointers.
State that lives across calls (split-K arrival counters reset by the last CTA, per-token reduce
counters, the sticky bad-id word, plans cached by pointer) is wrong only there.

`check` does exactly that for one tactic: eager calls, one capture, then checked replays — under
a CUDA graph two eager calls (the graph's warm-up) and `REPLAYS`; under a recorded-call capture one
eager call (the capture's call is the repeat path's) and `RECORDED_REPLAYS`, one per seed: there
every replay is a Python call, which on a count-bound host (the CPU: 0.1-8 s a call) sets the
check's cost. Before each replay, x, topk_ids (other experts, a -1 slot in the drawn seed) and
topk_weights are overwritten in place from one of two seeds (alternating, the seed the capture did
not see first), and the captured output is poisoned with NaN; the weight stays. In a search the
first seed is the job's own set 0, and the job's setup makes its float64 reference (the eager
check's) and the second seed's in one pass (`draw`). Each replay's output is compared per row — the
largest row's relative error against the float64 reference of that seed's inputs (`Refs`, drawn
once per (problem, bucket), with the rows as the compare reads them: `RowRef`) — and after the
rounds every arrival counter of the attached pool (its `*.locks` and `*.cnt` buffers) is back at
zero and the bad-id word is clear (every id was valid). The row errors stay on the device until the
last replay: the host waits once per check, for them, the counters and the word together.

The capture: on CUDA a real CUDA graph (`Graph`) for a launcher that declares itself capture-safe;
elsewhere (the CPU, or a launcher an engine runs eagerly) a recorded-call capture: the calls made
while "capturing" are recorded with their tensor arguments and replayed with the same tensors, so
a launcher that caches anything by pointer is held to it exactly as a graph holds it.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from autotune.core import inputs
from autotune.core.inputs import make_inputs     # the replay's own draw, apart from the job's setup
from autotune.core.problem import Problem
from autotune.tactics.scratch import ScratchPool

#: checked replays after a CUDA graph's capture (two seeds, alternating)
REPLAYS = 4
#: checked replays after a recorded-call capture: each seed once (its cost is one Python call each)
RECORDED_REPLAYS = 2
#: a row may be off by this many times the eager check's Frobenius tolerance (inputs.TOLERANCE):
#: one row's rounding spreads wider than the whole output's; a stale or unwritten row is off by ~1
ROW_SLACK = 2.0
#: a row whose reference norm is under this share of the mean row norm is compared against that
#: share instead (a row that cancels to ~0 is judged by its absolute error, not divided by ~0)
ROW_FLOOR = 1e-3


class ReplayFailed(Exception):
    """Wrong under graph replay (eager calls on fresh tensors may still have passed)."""


@dataclass
class RowRef:
    """One seed's reference as `row_error` compares it: the kept rows in float64 ([rows, N]), each
    row's denominator (its norm, floored at ROW_FLOOR x the mean row norm), and the kept rows' index
    into the output's rows (None: every row; a -1 pair's row is left out). Made once per (problem,
    bucket) and shared by every finalist's check: none of it depends on the tactic."""

    rows: torch.Tensor
    den: torch.Tensor
    keep: torch.Tensor | None


def row_ref(ref: torch.Tensor, ids: torch.Tensor | None) -> RowRef:
    """`ref` ([M, N], or [M, top_k, N] per pair) as `row_error` compares outputs against it."""
    n = ref.shape[-1]
    r = ref.double().reshape(-1, n)
    keep = None
    if ids is not None and ref.ndim == 3:
        keep = torch.nonzero(ids.reshape(-1) >= 0).reshape(-1).to(r.device)
        r = r.index_select(0, keep)
    norms = r.norm(dim=1)
    floor = ROW_FLOOR * float(norms.mean()) if r.shape[0] else 0.0
    den = norms.clamp(min=floor) if floor > 0 else torch.ones_like(norms)
    return RowRef(r, den, keep)


@dataclass
class Refs:
    """The refreshed inputs of one (problem, bucket), per seed, their float64 references, and those
    references as the row check reads them (`RowRef`, made here once for every finalist)."""

    sets: list[inputs.InputSet]
    refs: list[torch.Tensor]
    rows: list[RowRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [row_ref(r, s.topk_ids) for s, r in zip(self.sets, self.refs)]


def draw(problem: Problem, bucket: int, device: str, seed: int, weight: Any,
         known: tuple[inputs.InputSet, torch.Tensor | None] | None = None) -> Refs:
    """Two input sets from two seeds with `weight` (the bound one), each grouped-MoE set with one
    -1 slot (token 0 in the first, the last token in the second), and their references. `known`, a
    set on `weight` (the job's set 0, which the eager check compares against), stands as the first
    set as it is (the capture sees its values; the first replay the second's, with its -1 slot),
    with its float64 reference when one was made; (set, None) makes both references here in one
    pass (a grouped problem's experts dequantized once for both: a search's setup, whose eager
    check then reads `refs[0]`)."""
    if known is not None and known[0].w is not weight:
        raise ValueError("replay draw: the known set is on another weight than the bound one")
    sets = [] if known is None else [known[0]]
    for j in range(len(sets), 2):
        s = zlib.crc32(f"replay:{seed}:{problem.key}:{bucket}:{j}".encode())
        st = make_inputs(problem, bucket, device, s, 1, weights=[weight])[0]
        st.w = weight                       # W4A4: the bound weight's input scale, not one from this x
        if st.topk_ids is not None and st.topk_ids.numel():
            row = 0 if j == 0 else st.topk_ids.shape[0] - 1
            st.topk_ids[row, -1] = -1       # not on this rank: contributes nothing
        sets.append(st)
    if known is None or known[1] is None:
        return Refs(sets, inputs.references(problem, sets))
    return Refs(sets, [known[1], *inputs.references(problem, sets[1:])])


class Recorded:
    """A recorded-call capture: `capture(fn)` runs fn once and keeps it; `replay()` runs it again
    (same tensors, same pointers) and leaves its result in the captured output."""

    mode = "recorded"

    def __init__(self) -> None:
        self.fn: Callable[[], Any] | None = None
        self.out: Any = None

    def capture(self, fn: Callable[[], Any]) -> Any:
        self.fn, self.out = fn, fn()
        return self.out

    def replay(self) -> None:
        got = self.fn()
        if got is not self.out:             # a new tensor: a graph would have written the captured one
            self.out.copy_(got)

    def release(self) -> None:
        self.fn = self.out = None


class Graph:
    """A real CUDA graph: warm-up calls on a side stream, then one capture; `replay()` launches it.
    Where the device has room (`roomy`) the capture is begun and ended directly: torch.cuda.graph
    first synchronizes the device and empties the allocator's cache, so every check would hand back
    and allocate again what the last one freed (its graph's pool, its launcher's scratch, the row
    check's float64 rows). Without room it empties the cache first, as torch.cuda.graph does (a
    capture cannot free cached blocks)."""

    mode = "cuda graph"
    _stream: Any = None                 # the capture stream, one per process (torch.cuda.graph's way)

    def __init__(self) -> None:
        self.g: Any = None
        self.out: Any = None

    def capture(self, fn: Callable[[], Any], need_bytes: int = 0) -> Any:
        from autotune.engine import timing
        self.g = torch.cuda.CUDAGraph()
        pool, prev = torch.cuda.graph_pool_handle(), torch.cuda.current_stream()
        try:
            if roomy(need_bytes):
                if Graph._stream is None:
                    Graph._stream = torch.cuda.Stream()
                with torch.cuda.stream(Graph._stream):
                    self.g.capture_begin(pool=pool)
                    try:
                        self.out = fn()
                    finally:
                        self.g.capture_end()
            else:
                with torch.cuda.graph(self.g, pool=pool):
                    self.out = fn()
        except BaseException:
            torch.cuda.set_stream(prev)
            timing.abandon(self.g, pool)
            self.g = None
            raise
        return self.out

    def replay(self) -> None:
        self.g.replay()

    def release(self) -> None:
        self.g = self.out = None


#: a capture keeps the allocator's cache (Graph) while the device has this much free memory beyond
#: ROOM_PER_OUT times the captured output's bytes (its scratch and the row check's float64 rows)
ROOM_BYTES = 2 << 30
ROOM_PER_OUT = 8


def roomy(need_bytes: int) -> bool:
    """Whether the device's free memory (the driver's figure: the allocator's cache counts as used)
    leaves room for a capture that keeps the cache."""
    free, _ = torch.cuda.mem_get_info()
    return free >= ROOM_BYTES + ROOM_PER_OUT * need_bytes


def served_call(problem: Problem, launcher: Any, st: inputs.InputSet) -> Callable[[], Any]:
    """The call an engine makes: `launcher(x)` (FP4Linear, FP4MLP), or `launcher(x, ids, weights,
    routing_checked=True)` (FP4MoE: it checked the routing's shapes once), with `scratch_out=True`
    where the launcher has scratch outputs and the output is not the reduced one; never `out=`."""
    if problem.kind != "grouped_moe":
        return lambda: launcher(st.x)
    extra = {"scratch_out": True} if launcher.caps.scratch_out and problem.epilogue != "reduce" else {}
    return lambda: launcher(st.x, st.topk_ids, st.topk_weights, routing_checked=True, **extra)


def row_error(problem: Problem, out: torch.Tensor, ref: torch.Tensor | RowRef, ids: torch.Tensor | None = None) -> float:
    """The largest row's relative error (inf when a row holds NaN or Inf). Rows of a per-pair
    output ([M, top_k, N]) are (token, slot) pairs; a -1 pair's row is left out (nothing reads it).
    `ref`: the float64 reference with `ids`, or its `RowRef` (made once per (problem, bucket))."""
    rr = ref if isinstance(ref, RowRef) else row_ref(ref, ids)
    return _finite(float(_row_error_dev(out, rr)))


def _row_error_dev(out: torch.Tensor, rr: RowRef) -> torch.Tensor:
    """`row_error` left on the device (no host sync): NaN or Inf where an output row holds one."""
    o = out.reshape(-1, rr.rows.shape[1])
    if rr.keep is not None:
        o = o.index_select(0, rr.keep)
    if not rr.rows.shape[0]:
        return torch.zeros((), dtype=torch.float64, device=out.device)
    return ((o.double() - rr.rows).norm(dim=1) / rr.den).max()


def _finite(err: float) -> float:
    return err if math.isfinite(err) else math.inf


def counters(pool: ScratchPool) -> list[tuple[str, torch.Tensor]]:
    """The pool's arrival counters: its `*.locks` (split-K) and `*.cnt` (per-token reduce) buffers."""
    return [(k[2], b) for k, b in pool.bufs.items() if k[2].rsplit(".", 1)[-1] in ("locks", "cnt")]


@dataclass
class Result:
    max_row_err: float
    mode: str                       # "cuda graph" | "recorded"
    replays: int


def check(problem: Problem, launcher: Any, refs: Refs, device: str, pool: ScratchPool, word: Any) -> Result:
    """Eager calls, a capture, checked replays with inputs refreshed in place (the module says how
    many of each for a CUDA graph and for a recorded capture); raises ReplayFailed naming the
    replay and the row error, a counter not at rest or the bad-id word set. `launcher` is bound
    with `pool` and `word` attached; `refs` from `draw` for its problem. The host waits for the
    device once, after the last replay: each replay's row error stays on the device until then."""
    live = _live(refs.sets[0])
    call = served_call(problem, launcher, live)
    real = device == "cuda" and launcher.caps.capture_safe
    cap: Recorded | Graph = Graph() if real else Recorded()
    warm(call, real)
    replays = REPLAYS if real else RECORDED_REPLAYS
    try:
        _capture(problem, cap, call, refs)
        errs = [_replay(cap, live, refs, r) for r in range(replays)]
        figures = torch.stack([*errs, *_at_rest_counts(pool, word)]).tolist()   # the one host sync
    finally:
        cap.release()
    worst = _judge(problem, figures[:replays])
    _at_rest(pool, word, figures[replays:])
    return Result(worst, cap.mode, replays)


def _live(a: inputs.InputSet) -> inputs.InputSet:
    """The tensors the calls see: set a's, cloned, overwritten in place with either set's values."""
    return inputs.InputSet(a.x.clone(), a.w,
                           None if a.topk_ids is None else a.topk_ids.clone(),
                           None if a.topk_weights is None else a.topk_weights.clone())


def warm(call: Callable[[], Any], real: bool) -> None:
    """Under a CUDA graph the first call plans and the second takes the repeat path, both eager on a
    side stream (the graph's warm-up); under a recorded capture the first call plans and the
    capture's call is the repeat path."""
    if not real:
        call()
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
        call()
    torch.cuda.current_stream().wait_stream(side)


def _capture(problem: Problem, cap: "Recorded | Graph", call: Callable[[], Any], refs: Refs) -> None:
    """The served call captured; its output a tensor of the reference's shape, or ReplayFailed."""
    try:
        out = cap.capture(call) if isinstance(cap, Recorded) else \
            cap.capture(call, refs.refs[0].numel() * inputs.OUT_DTYPE[problem.out_dtype].itemsize)
    except Exception as e:
        raise ReplayFailed(f"capture failed ({cap.mode}): {type(e).__name__}: {str(e)[:200]}") from e
    if not torch.is_tensor(out):
        raise ReplayFailed(f"the served call returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(refs.refs[0].shape):
        raise ReplayFailed(f"replay 1: output {tuple(out.shape)}, expected {tuple(refs.refs[0].shape)}")


def _replay(cap: "Recorded | Graph", live: inputs.InputSet, refs: Refs, r: int) -> torch.Tensor:
    """Replay r: set b first (values the capture did not see), then a, b, …, written in place; the
    output poisoned (NaN) before; its largest row error against that seed's reference, on the
    device (stream order keeps it ahead of the next replay's refresh and poison)."""
    j = (r + 1) % 2
    src = refs.sets[j]
    live.x.copy_(src.x)
    if live.topk_ids is not None:
        live.topk_ids.copy_(src.topk_ids)
        live.topk_weights.copy_(src.topk_weights)
    cap.out.fill_(float("nan"))
    cap.replay()
    return _row_error_dev(cap.out, refs.rows[j])


def _judge(problem: Problem, errs: list[float]) -> float:
    """The largest row error over the replays, or ReplayFailed naming the first one over the
    tolerance (ROW_SLACK x the eager check's)."""
    tol = ROW_SLACK * inputs.TOLERANCE[problem.out_dtype]
    for r, err in enumerate(map(_finite, errs)):
        if not err <= tol:
            raise ReplayFailed(f"replay {r + 1} (inputs refreshed in place): largest row relative error "
                               f"{err:.3g} > {tol:g} against the float64 reference")
    return max(map(_finite, errs), default=0.0)


def _at_rest_counts(pool: ScratchPool, word: Any) -> list[torch.Tensor]:
    """Per arrival counter of `pool`, then the bad-id word: how many entries are not zero (on the device)."""
    ts = [c for _, c in counters(pool)] + ([] if word is None else [word])
    return [torch.count_nonzero(t).to(torch.float64) for t in ts]


def _at_rest(pool: ScratchPool, word: Any, counts: list[float]) -> None:
    """ReplayFailed unless every counter is back at zero and the bad-id word is clear."""
    for (name, _), left in zip(counters(pool), counts):
        if left:
            raise ReplayFailed(f"{int(left)} arrival counters of {name} not back at zero after the replays")
    if word is not None and counts[-1]:
        raise ReplayFailed("the bad-id word is set though every expert id was valid")
