"""Compare the winners of two caches (or exports) per (problem, bucket): a one-GPU against a
several-GPU run, a merged cache against the run it should reproduce, the main job against the
committed full search.

    python3 bench/compare_winners.py A.db B.db [--json OUT]
    python3 bench/compare_winners.py NEW.db OLD.db --retime [--max-bucket 64]   # on a GPU

--retime re-times, per (problem, bucket) both caches hold (up to --max-bucket), A's and B's winner
interleaved in ONE worker (the search's own interleaved final round: same inputs, cold L2, CUDA-graph
replays), so two caches measured on different days and code compare on one clock: A's winner is
"within" when its time is at most (1 + --within) x B's winner's.

A pair counts as the same when the tactic is the same, or, failing that, as a tie when each
cache's own winner and the other's are within the winner rule's tie tolerance in the cache that
timed both (autotune.core.winner.TIE_TOLERANCE; a tactic successive halving dropped early has only
a short timing, which is shown as such). Prints one line per differing pair and a summary.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402

from autotune.core.winner import TIE_TOLERANCE  # noqa: E402


def winners(path: str) -> dict[tuple[str, int], tuple[str, float]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return {(p, b): (t, us) for p, b, t, us in con.execute(
        "select problem_key, bucket, tactic_id, median_us from winners")}


def trial_us(path: str, problem: str, bucket: int, tactic: str) -> tuple[float | None, str | None]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = con.execute("select median_us, status from trials where problem_key=? and bucket=? and tactic_id=? "
                          "order by id desc limit 1", (problem, bucket, tactic)).fetchone()
    except sqlite3.OperationalError:   # an export holds winners only
        return None, None
    return (row[0], row[1]) if row else (None, None)


def compare(a: str, b: str) -> dict:
    wa, wb = winners(a), winners(b)
    keys = sorted(set(wa) | set(wb))
    same = tie = differ = missing = 0
    rows = []
    for k in keys:
        if k not in wa or k not in wb:
            missing += 1
            rows.append({"problem": k[0], "bucket": k[1], "only_in": a if k in wa else b})
            continue
        (ta, ua), (tb, ub) = wa[k], wb[k]
        if ta == tb:
            same += 1
            continue
        # the other run's winner as timed in this run, and the reverse
        ub_in_a, sb_in_a = trial_us(a, *k, tb)
        ua_in_b, sa_in_b = trial_us(b, *k, ta)
        # an export keeps winners only: judge by the cross timings that exist (at least one)
        cross = [(x, own) for x, own in ((ub_in_a, ua), (ua_in_b, ub)) if x is not None]
        within = bool(cross) and all(x <= own * (1 + TIE_TOLERANCE) for x, own in cross)
        tie += within
        differ += not within
        rows.append({"problem": k[0], "bucket": k[1], "a_us": ua, "b_us": ub, "b_winner_in_a_us": ub_in_a,
                     "b_winner_in_a_status": sb_in_a, "a_winner_in_b_us": ua_in_b, "a_winner_in_b_status": sa_in_b,
                     "tie": within})
    return {"a": a, "b": b, "pairs": len(keys), "same": same, "tie": tie, "differ": differ, "missing": missing,
            "rows": rows}


def retime(a: str, b: str, max_bucket: int, within: float, device: str = "cuda") -> dict:
    """A's and B's winners timed interleaved, per common (problem, bucket <= max_bucket)."""
    from autotune.core.problem import Problem
    from autotune.core.tactic import Tactic
    from autotune.engine.strategies.successive_halving import Halving
    from autotune.engine.search import Job
    from autotune.engine.timing import TimerConfig
    from autotune.engine.sink import Collect
    from autotune.engine.workers import InlineExecutor, ProcessExecutor, run_job

    def tactics(path):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        return {(pk, bk): Tactic.from_json(pj) for pk, bk, pj in
                con.execute("select w.problem_key, w.bucket, t.params_json from winners w join tactics t on t.id = w.tactic_id")}
    ta, tb = tactics(a), tactics(b)
    keys = sorted(k for k in set(ta) & set(tb) if k[1] <= max_bucket)
    ex = ProcessExecutor(device, timeout_s=120) if device == "cuda" else InlineExecutor(device)
    rows = []
    try:
        for pk, bk in keys:
            pair = tuple(dict.fromkeys((ta[pk, bk], tb[pk, bk])))
            got = Collect()
            failure = run_job(ex, Job(Problem.from_key(pk), bk, pair, tb[pk, bk].id), TimerConfig(), Halving(), 0, got)
            outs = got.outcomes
            us = {o.tactic.id: (o.median_us if o.status == "ok" else None, o.reason) for o in outs}
            ua, ub = us.get(ta[pk, bk].id, (None, failure))[0], us.get(tb[pk, bk].id, (None, failure))[0]
            ok = ua is not None and ub is not None and ua <= ub * (1 + within)
            rows.append({"problem": pk, "bucket": bk, "a_tactic": str(ta[pk, bk]), "b_tactic": str(tb[pk, bk]),
                         "a_us": ua, "b_us": ub, "ratio": (ua / ub) if ua and ub else None, "within": ok,
                         "why": None if ok else failure or "; ".join(r for _, r in us.values() if r)})
    finally:
        ex.close()
    return {"a": a, "b": b, "pairs": len(rows), "within": sum(r["within"] for r in rows), "margin": within,
            "rows": rows}


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json")
    ap.add_argument("--retime", action="store_true", help="re-time both winners interleaved in one worker (GPU)")
    ap.add_argument("--max-bucket", type=int, default=64, help="--retime: buckets up to this M")
    ap.add_argument("--within", type=float, default=0.03, help="--retime: A's winner may be this much slower")
    ap.add_argument("--device", default="cuda", help="--retime: where to time (cpu for a smoke run)")
    args = ap.parse_args(argv)
    for path in (args.a, args.b):
        if not Path(path).is_file():
            print(f"compare_winners: no such cache {path}", file=sys.stderr)
            return 2
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    if args.retime:
        r = retime(args.a, args.b, args.max_bucket, args.within, args.device)
        for row in r["rows"]:
            print(f"{row['problem']} m={row['bucket']}: A {row['a_tactic']} {f(row['a_us'])} us, B {row['b_tactic']} "
                  f"{f(row['b_us'])} us, ratio {f(row['ratio'])}{'' if row['within'] else '  NOT WITHIN: ' + str(row['why'])}")
        print(f"{r['pairs']} (problem, bucket) pairs re-timed interleaved: A's winner within {args.within:.0%} of "
              f"B's on {r['within']}")
    else:
        r = compare(args.a, args.b)
        for row in r["rows"]:
            if "only_in" in row:
                print(f"{row['problem']} m={row['bucket']}: winner only in {row['only_in']}")
                continue
            print(f"{row['problem']} m={row['bucket']}: A {f(row['a_us'])} us (in B: {f(row['a_winner_in_b_us'])} "
                  f"{row['a_winner_in_b_status'] or ''}), B {f(row['b_us'])} us (in A: {f(row['b_winner_in_a_us'])} "
                  f"{row['b_winner_in_a_status'] or ''}){' tie' if row['tie'] else ''}")
        print(f"{r['pairs']} (problem, bucket) pairs: {r['same']} same tactic, {r['tie']} different but tied within "
              f"{TIE_TOLERANCE:.0%}, {r['differ']} different, {r['missing']} in one cache only")
    if args.json:
        harness.write(args, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
