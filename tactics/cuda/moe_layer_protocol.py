"""The MoE layer kernel's ticket/counter protocol ported to the CPU (docs/cuda-family.md, "The layer
kernel's protocol"): one launch computes a layer's w13 (SwiGLU) and its w2 (top_k summed), the w2
CTAs reading h, the w13 output, that other CTAs of the same launch write. This module is the protocol's
specification and its model: each CTA's decisions in the kernel's order, run by a scheduler that
starts CTAs in any order with any residency limit, over launches with changing routes.

The device state (`State`, sized and zeroed by the launcher before any capture, never written by
the host again):
  * `tick`: the next role's ticket. A CTA takes it after `griddepcontrol.wait`, so tickets follow the
    order CTAs start, never blockIdx: tickets 0 .. n13 - 1 are the w13 roles, then the w2 roles. A w2
    role is handed out only after every w13 role went to a CTA that already runs, and w13 roles wait
    for nothing, so the launch progresses at any residency, 1 CTA included.
  * `epoch`: the launch's epoch in [0, EPOCH_MAX], read once per CTA after its ticket, advanced by the
    launch's last CTA (on the device: nothing changes on the host between graph replays).
  * `cnt[e]`: expert e's publication word, `epoch << 16 | arrivals`. A w13 CTA that led a group of e
    stores its h rows, `__threadfence`, then arrives (a CAS: a word of another epoch restarts at
    `epoch << 16 | 1`), so no counter is ever reset between launches. A w2 CTA acquires each expert
    of its token: it spins (bounded) until the word is `epoch << 16 | need(e)`, need(e) = ceil(pairs
    of e / CAP) x the w13 N tiles, then reads h with L2-coherent loads only.
  * `done`: CTAs finished. The last one resets `tick` and `done` and advances the epoch; at the wrap
    (EPOCH_MAX -> 1) it first clears every `cnt` (a word last written EPOCH_MAX launches ago would
    otherwise carry the new epoch with old arrivals).
  * `err`: the error word. A spin that runs past its bound records ERR_SPIN and the CTA gives up (its
    rows are not written); the launcher's check raises with `describe(err)`: a protocol bug fails a
    call with a message, never hangs it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterator, Sequence

CAP = 8                     # pairs per w13 group (moe_mma's direct route at m_tiles 1)
EPOCH_BITS = 16
EPOCH_MAX = (1 << EPOCH_BITS) - 1
ARRIVALS_MAX = (1 << EPOCH_BITS) - 1
ERR_SPIN = 1                # a w2 CTA's acquire ran past its bound
MAX_PAIRS = 256             # M * top_k (the shared slot included): the kernel's scope
#: spin iterations before a w2 CTA gives up (the kernel's bound: ~2^22 polls, well past a wave)
SPIN_BOUND = 1 << 22


def describe(err: int) -> str:
    if err == 0:
        return "no error"
    if err == ERR_SPIN:
        return ("moe_layer: a w2 CTA waited past its bound for an expert's h (a protocol bug: a w13 role "
                "not run or its arrival lost); the layer's output is not valid")
    return f"moe_layer: unknown error word {err:#x}"


def next_epoch(ep: int) -> tuple[int, bool]:
    """The epoch after `ep` and whether the counters are cleared first (the wrap)."""
    return (ep + 1, False) if ep < EPOCH_MAX else (1, True)


def groups(ids: Sequence[int], n_exp: int) -> dict[int, int]:
    """Expert e's w13 groups: ceil(its pairs / CAP) (ids outside [0, n_exp) route nowhere)."""
    count: dict[int, int] = {}
    for e in ids:
        if 0 <= e < n_exp:
            count[e] = count.get(e, 0) + 1
    return {e: -(-c // CAP) for e, c in count.items()}


def leads(ids: Sequence[int], q: int) -> bool:
    """Whether pair q leads a group of its expert: its rank among that expert's pairs is a multiple of CAP."""
    e = ids[q]
    return sum(1 for j in range(q) if ids[j] == e) % CAP == 0


def check_scope(m: int, top_k: int, n13_tiles: int, n_exp: int) -> None:
    """The launcher's refusals (one line each): the pairs, and the arrivals one counter word holds."""
    if m * top_k > MAX_PAIRS:
        raise ValueError(f"moe_layer: M * top_k = {m * top_k} pairs > {MAX_PAIRS} (the layer kernel's scope)")
    if -(-m * top_k // CAP) * n13_tiles > ARRIVALS_MAX:
        raise ValueError(f"moe_layer: {n13_tiles} w13 tiles x groups exceed one counter's {ARRIVALS_MAX} arrivals")
    if n_exp < 1:
        raise ValueError("moe_layer: no experts")


@dataclass
class State:
    """The device words the launcher allocates (zeroed) and warms before capture."""
    n_exp: int
    tick: int = 0
    done: int = 0
    epoch: int = 0
    err: int = 0
    cnt: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.cnt:
            self.cnt = [0] * self.n_exp


@dataclass(frozen=True)
class Launch:
    """One layer launch: ids [M * top_k] (the shared slot already in them), the w13 and w2 N tiles."""
    ids: tuple[int, ...]
    top_k: int
    n13_tiles: int          # w13 CTAs per pair slot (N tiles of [gate; up])
    n2_tiles: int           # w2 CTAs per token

    @property
    def m(self) -> int:
        return len(self.ids) // self.top_k

    @property
    def n13(self) -> int:
        return len(self.ids) * self.n13_tiles

    @property
    def grid(self) -> int:
        return self.n13 + self.m * self.n2_tiles


@dataclass
class Trace:
    """What the model observed, for the checks: h rows' writes and reads as (launch, pair, tile)."""
    written: dict[tuple[int, int], int] = field(default_factory=dict)   # (pair, tile) -> launch of its last write
    reads_ok: int = 0
    violations: list[str] = field(default_factory=list)
    y_done: set[tuple[int, int]] = field(default_factory=set)           # (token, w2 tile) written this launch
    launch: int = 0                                                       # the launch being run


def cta(st: State, ln: Launch, index: int, tr: Trace, by_ticket: bool = True,
        spin_bound: int = SPIN_BOUND) -> Iterator[str]:
    """One CTA, in the kernel's order; yields at every point another CTA may run between (a spin poll
    yields "spin"). `by_ticket=False` is the bug the ticket prevents (roles by blockIdx), for the tests."""
    yield "wait"                                       # griddepcontrol.wait: the previous launch is done
    if by_ticket:
        t = st.tick                                    # atomicAdd(tick, 1)
        st.tick += 1
    else:
        t = index
    ep = st.epoch                                      # read once, after the ticket
    yield "ticket"
    n_exp = st.n_exp
    if t < ln.n13:                                     # w13 role: pair slot q, N tile nt
        q, nt = divmod(t, ln.n13_tiles)
        e = ln.ids[q]
        if 0 <= e < n_exp and leads(ln.ids, q):
            yield "mma"                                # the group's rows of h, then __threadfence
            rank_pairs = [j for j in range(q, len(ln.ids)) if ln.ids[j] == e][:CAP]
            for p in rank_pairs:
                tr.written[(p, nt)] = tr.launch
            yield "fence"
            v = st.cnt[e]                              # the CAS arrival (atomic: no yield inside)
            st.cnt[e] = v + 1 if v >> EPOCH_BITS == ep else (ep << EPOCH_BITS) | 1
    else:                                              # w2 role: token tok, N tile nt
        tok, nt = divmod(t - ln.n13, ln.n2_tiles)
        slots = [tok * ln.top_k + s for s in range(ln.top_k)]
        g = groups(ln.ids, n_exp)
        bad = any(not (-1 <= ln.ids[p] < n_exp) for p in slots)
        ok = not bad
        for e in sorted({ln.ids[p] for p in slots if 0 <= ln.ids[p] < n_exp}) if ok else ():
            want = (ep << EPOCH_BITS) | (g[e] * ln.n13_tiles)
            polls = 0
            while st.cnt[e] != want:                   # acquire (ld.acquire.gpu), bounded
                polls += 1
                if polls > spin_bound:
                    st.err = st.err or ERR_SPIN
                    ok = False
                    break
                yield "spin"
            if not ok:
                break
        if ok:
            for p in slots:                            # h read with ld.global.cg after the acquire
                if 0 <= ln.ids[p] < n_exp:
                    for k in range(ln.n13_tiles):
                        if tr.written.get((p, k)) != tr.launch:
                            tr.violations.append(f"launch {tr.launch}: token {tok} read h[{p}] tile {k} "
                                                 f"from launch {tr.written.get((p, k))}")
                        tr.reads_ok += 1
            yield "mma"
            tr.y_done.add((tok, nt))
    yield "exit"
    d = st.done                                        # __threadfence; atomicAdd(done, 1)
    st.done += 1
    if d == ln.grid - 1:                               # the last CTA: the next launch's state
        nxt, wrap = next_epoch(st.epoch)
        if wrap:
            st.cnt = [0] * n_exp
        st.epoch = nxt
        st.tick = st.done = 0


class Deadlock(RuntimeError):
    pass


def run_launch(st: State, ln: Launch, residency: int, rng: random.Random, tr: Trace, launch_no: int,
               by_ticket: bool = True, spin_bound: int = SPIN_BOUND) -> None:
    """One launch: CTAs start in a random order, at most `residency` at once; the scheduler steps a
    random resident CTA. Raises Deadlock when every resident CTA spins on a state no running CTA can
    change and no other CTA can start (the device would run the spins to their bound and record
    ERR_SPIN); with a `spin_bound` below SPIN_BOUND the spins end at it instead, as on the device."""
    if residency < 1:
        raise ValueError("residency must be >= 1")
    tr.launch = launch_no
    tr.y_done = set()
    order = list(range(ln.grid))
    rng.shuffle(order)
    pending = iter(order)
    resident: list[Iterator[str]] = []
    spinning: set[int] = set()       # resident CTAs that polled in vain since the state last changed
    started = 0
    while True:
        while len(resident) < residency and started < ln.grid:
            resident.append(cta(st, ln, next(pending), tr, by_ticket, spin_bound))
            started += 1
        if not resident:
            break
        i = rng.randrange(len(resident))
        try:
            step = next(resident[i])
        except StopIteration:        # its `done` arrival changed the state
            resident.pop(i)
            spinning.clear()
            continue
        if step != "spin":
            spinning.clear()
            continue
        spinning.add(id(resident[i]))
        if len(spinning) == len(resident) and spin_bound >= SPIN_BOUND:
            raise Deadlock(f"launch {launch_no}: all {len(resident)} resident CTAs spin "
                           f"(residency {residency}, {ln.grid - started} not started)")
