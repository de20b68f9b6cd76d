"""`verify`: the deployment image's layers, served from a cache as an engine serves them."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from autotune.core.env import current
from autotune.cache import check_winner
from autotune.api.args import BadInput, model_problems, open_store


@dataclass
class Verified:
    """One distinct problem of a model, served from a cache as an engine serves it (`verify`)."""

    problem: str
    ms: tuple[int, ...]            # the M checked (each rung's bucket, or those asked for)
    m: int                         # the M with the largest row error (or the first failure's)
    tactic: str                    # what served that M
    rung: str                      # its rung ("exact", "default", …; "one copy: substituted")
    max_row_err: float             # the largest row's relative error, eager and replayed, over every M
    replay_checked: int            # of the rungs served by a stored winner, those whose winner passed the replay check
    winners: int                   # rungs served by a stored winner
    ok: bool
    why: str = ""

    def line(self) -> str:
        rc = f"{self.replay_checked}/{self.winners}" if self.winners else "-"
        mark = "" if self.replay_checked == self.winners else " (not replay-checked: some winners)"
        return (f"{'PASS' if self.ok else 'FAIL'}  {self.problem}  M={self.m} {self.tactic} ({self.rung})  "
                f"max row err {self.max_row_err:.3g}  replay-checked {rc}{mark}  [{len(self.ms)} M]"
                + (f"  {self.why}" if self.why else ""))


def verify(model: str | os.PathLike, cache=None, *, tp: int = 1, ep: int = 1, one_copy: bool = False,
           one_copy_upto: int | None = None, ms: Sequence[int] | None = None, seed: int = 0) -> list[Verified]:
    """Every distinct problem of `model` served from `cache` as an engine serves it: a Dispatcher
    with the runtime's defaults (`one_copy` / `one_copy_upto` as an engine would pass them), each
    problem's random weight bound once (`Dispatcher.bind`, a clone: one copy packs it in place), and
    at every M (each rung's bucket, or `ms`) the rung's launcher called as the layers call it:
    eagerly, then captured (a CUDA graph on the GPU, a recorded-call capture elsewhere) and replayed
    with x, routes and weights refreshed in place (autotune.engine.replay). Each output row is
    compared against float64; a bad-id word set by valid ids fails too. One `Verified` per problem."""
    from autotune.runtime.dispatch import Dispatcher
    env = current()
    for m in ms or ():
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise BadInput(f"--m: every M must be a positive integer, not {m!r}")
    uses = model_problems(model, tp=tp, ep=ep, include_attention=True, fused_moe=True, fold_shared=True,
                          fused_mlp=True)
    store = open_store(cache, readonly=True)
    try:
        won = {(w.problem_key, w.bucket): w for w in store.winners(env.device_key) if check_winner(w) is None}
        d = Dispatcher(store, env=env, record_misses=False, one_copy=one_copy, one_copy_upto=one_copy_upto)
        return [_verify_problem(d, p, won, ms, seed, env) for p in dict.fromkeys(u.problem for u in uses)]
    finally:
        store.close()


def _verify_problem(d, p, won: dict, ms: Sequence[int] | None, seed: int, env) -> Verified:
    """One problem: its seeded random weight bound once (a clone), then served and checked at every
    M; the first M that fails, else the M with the largest row error. `won`: (problem key, bucket)
    -> the stored winner that passes the row checks."""
    import zlib

    from autotune.core import inputs
    from autotune.core.formats import FP4Weight
    from autotune.engine import replay
    s = zlib.crc32(f"verify:{seed}:{p.key}".encode())
    w = inputs.make_inputs(p, 1, env.device, s, 1, weights=[inputs.seeded_weight(p, env.device, s)])[0].w
    clone = FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt, w.input_scale)
    try:
        bt = d.bind(p, clone)
    except (ValueError, TypeError) as e:
        return Verified(p.key, (), 0, "-", "-", math.inf, 0, 0, False, f"bind: {e}")
    subs = {b: u for b, _, u in bt.substituted}
    table = d.table(p)
    todo = tuple(ms) if ms else (tuple(table.buckets) or (1,))
    worst, first_bad, rc, nw = (0.0, todo[0], "-", "-"), None, 0, 0
    for m in todo:
        rung, t = d.rung_for(p, m)
        if m in subs:
            rung, t = "one copy: substituted", subs[m]
        stored = won.get((p.key, m))
        if stored is not None and rung == "exact" and m not in subs:
            nw += 1
            rc += bool(stored.replay_checked)
        launcher = bt.launcher(m)
        refs = replay.draw(p, m, env.device, s, w)
        try:
            err = _row_error(d, p, launcher, refs, env.device)
        except Exception as e:       # a launcher's own error is this M's failure, not verify's
            if first_bad is None:
                text = str(e).splitlines()[0][:200] if str(e) else ""
                first_bad = (m, str(t), rung, f"M={m}: {type(e).__name__}" + (f": {text}" if text else ""))
            continue
        if err >= worst[0]:
            worst = (err, m, str(t), rung)
    if first_bad is not None:
        m, t, rung, why = first_bad
        return Verified(p.key, todo, m, t, rung, math.inf, rc, nw, False, why)
    return Verified(p.key, todo, worst[1], worst[2], worst[3], worst[0], rc, nw, True)


def _row_error(d, p, launcher, refs, device: str) -> float:
    """The largest output row's relative error of `launcher` on refs' inputs, called eagerly and then
    captured and replayed; ReplayFailed when the eager error passes the tolerance or a bad-id word is
    set though every id was valid."""
    from autotune.core import inputs
    from autotune.engine import replay
    eager = replay.row_error(p, replay.served_call(p, launcher, refs.sets[0])(), refs.refs[0],
                             refs.sets[0].topk_ids)
    tol = replay.ROW_SLACK * inputs.TOLERANCE[p.out_dtype]
    if not eager <= tol:
        raise replay.ReplayFailed(f"eager: largest row relative error {eager:.3g} > {tol:g}")
    err = max(eager, replay.check(p, launcher, refs, device, d.scratch, None).max_row_err)
    bad = d.routing_errors()
    if bad:
        raise replay.ReplayFailed(f"the bad-id word of {bad[0]} is set though every id was valid")
    return err
