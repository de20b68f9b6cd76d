"""What a report shows, computed from the cache alone (no plotting, no HTML here).

Per device: the winner, the family default, the best of each family and any baseline per
(problem, bucket); where each winner sits against the roofline ceilings; the verdicts grouped
by reason; the environment fingerprint. A *baseline* of an FP4 problem is a problem of the same
shape whose weights are not FP4 (e.g. a bf16×bf16 GEMM timed by a cuBLAS family); it is folded
into the FP4 problem's view rather than shown on its own.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from autotune.core import measure
from autotune.core.problem import BLOCK, Problem
from autotune.core.records import Trial, Winner
from autotune.report import ceilings as ceil_mod
from autotune.report.step import StepView, step_view, with_ceilings
from autotune.report.names import family_default, layer_label, layer_title, short_tactic
from autotune.report.traffic import call_bytes, intensity
from autotune.core.arch import ARCHS, arch_for_cc
from autotune.cache.files import CacheError
from autotune.cache.rows import check_miss, check_trial, check_winner


def tactic_label(params_json: str) -> str:
    d = json.loads(params_json)
    prm = ",".join(f"{k}={v}" for k, v in d["params"].items())
    return f"{d['family']}[{prm}]"


#: a reason longer than this (or of several lines) is shown cut in tables; the full text stays in
#: ReasonGroup.reason (`show --verbose`, `show --json --verbose`, the report's summary.json)
SHORT = 80
_EXC = re.compile(r"\b[A-Z][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Lost)\b:?")
_NUM = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def short_reason(reason: str, width: int = SHORT) -> str:
    """One line: a reason as it is when it fits, else its text up to the exception's type and the
    first sentence of the message, cut to `width` characters (…). E.g. a CUDA out-of-memory
    reason -> 'input setup failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.…'"""
    text = reason.strip()
    if len(text) <= width and "\n" not in text:
        return text
    first = text.splitlines()[0].rstrip() if text else ""
    m = _EXC.search(first)
    head, msg = (first[:m.end()], first[m.end():].strip()) if m else ("", first)
    parts = re.split(r"(?<=[.;]) ", msg)              # whole sentences of the message while they fit
    kept = parts[0]
    for nxt in parts[1:]:
        if len(head) + len(kept) + len(nxt) + 2 > width - 1:
            break
        kept += " " + nxt
    out = f"{head} {kept}".strip() if head else kept
    if len(out) > width - 1:
        out = out[:width - 1].rstrip()
    return out + "…"


def reason_class(reason: str) -> str:
    """Reasons that differ only in numbers are one group (as the search's summary does); a reason
    too long for one table line is grouped by its short form, every number alike."""
    if len(reason.strip()) <= SHORT and "\n" not in reason.strip():
        return re.sub(r"\d+", "#", reason)
    return _NUM.sub("#", short_reason(reason))


#: the mark after a winner that did not pass the replay check (show, report)
NOT_REPLAYED = "(not replay-checked)"


@dataclass
class Point:
    """One (problem, bucket) on one device."""

    bucket: int
    winner: str
    winner_family: str
    winner_us: float
    default: str
    default_us: float | None
    speedup: float | None
    best_by_family: dict[str, float]
    baselines: dict[str, float]          # label -> µs
    flops: float
    bytes: float
    intensity: float
    tflops: float
    gbps: float
    compute_kind: str                    # which MMA rate bounds it ("bf16" / "fp4")
    roof_tflops: float | None            # min(bandwidth × intensity, compute peak)
    roof_fraction: float | None          # achieved / roof
    replay_checked: bool = True          # the winner passed the replay check (autotune.engine.replay)


@dataclass
class ProblemView:
    key: str
    points: list[Point]
    baseline_keys: list[str]
    layers: tuple[str, ...] = ()         # the model's layers running it, when the report knows the model
    per_forward: int | None = None       # runs per forward pass on one GPU
    arch: str = ""                       # the device's arch (the family defaults of `short`)
    winner_params: dict[int, str] = field(default_factory=dict)   # bucket -> the winner's tactic JSON

    def winner_json(self, p: Point) -> str:
        return self.winner_params[p.bucket]

    @property
    def buckets(self) -> list[int]:
        return [p.bucket for p in self.points]

    @property
    def title(self) -> str:
        """'mlp.experts.w13 [3–77], 75× per forward', or the key when the model is unknown."""
        return layer_title(self.layers, self.per_forward) if self.layers else self.key

    @property
    def label(self) -> str:
        """The legend form: 'mlp.experts.w13 [3–77] ×75', or the key."""
        return layer_label(self.layers, self.per_forward, self.key)

    def short(self, params_json: str) -> str:
        """A tactic's name cut to its family and the parameters that differ from its default."""
        fam = json.loads(params_json)["family"]
        return short_tactic(params_json, family_default(fam, self.key, self.arch))   # asked only by the page


@dataclass
class ReasonGroup:
    status: str            # "rejected" | "failed" | "note"
    reason: str            # one full example
    count: int

    @property
    def short(self) -> str:
        """The example on one table line (short_reason)."""
        return short_reason(self.reason)


@dataclass
class FamilyVerdicts:
    family: str
    kept: int              # (problem, tactic) pairs that passed the static verdict
    rejected: int
    failed: int            # kept but failed the build / check on at least one bucket
    ok: int                # timed to the end on at least one bucket
    dropped: int           # cut early by successive halving on at least one bucket
    reasons: list[ReasonGroup]
    unknown: int = 0       # static plans only: verdict "unknown until checked on the device"


@dataclass
class DeviceView:
    device_key: str
    record: dict
    arch: str
    is_cpu: bool
    ceilings: dict | None
    problems: list[ProblemView]
    verdicts: list[FamilyVerdicts]
    misses: list[dict]
    libsets: dict[str, dict]
    step: StepView | None = None         # the MLP decode step, when the report knows the model

    @property
    def gpu_name(self) -> str:
        return self.record.get("gpu_name", self.device_key)


@dataclass
class ArchPlan:
    """The static verdicts of an arch that was not measured (families' verdicts, nothing compiled)."""

    arch: str
    problems: int
    verdicts: list[FamilyVerdicts]


@dataclass
class Summary:
    cache: str
    generated_at: str
    schema_version: int | None
    meta: dict[str, str]
    devices: list[DeviceView]
    notes: list[str] = field(default_factory=list)
    plans: list[ArchPlan] = field(default_factory=list)
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)   # "winners"/"trials"/"misses" -> reason -> n

    def to_dict(self) -> dict:
        return asdict(self)


def _arch_name(rec: dict) -> str:
    cc = str(rec.get("cc", ""))
    if cc == "cpu":
        return "cpu"
    try:
        major, minor = (int(x) for x in cc.split("."))
        return arch_for_cc(major, minor).name
    except ValueError:
        return f"cc {cc}"


def _problem(key: str) -> Problem | None:
    try:
        return Problem.from_key(key)
    except ValueError:
        return None


def _shape(p: Problem) -> tuple:
    return (p.kind, p.n, p.k, p.experts, p.top_k)


def _best(trials: list[Trial]) -> dict[tuple[str, int], dict[str, tuple[float, str]]]:
    """(problem, bucket) -> family -> (best median µs, tactic label) among ok trials."""
    out: dict[tuple[str, int], dict[str, tuple[float, str]]] = defaultdict(dict)
    for t in trials:
        if t.status == "ok" and t.median_us is not None and t.bucket > 0:
            cur = out[(t.problem_key, t.bucket)].get(t.family)
            if cur is None or t.median_us < cur[0]:
                out[(t.problem_key, t.bucket)][t.family] = (t.median_us, tactic_label(t.params_json))
    return out


_ORDER = {"rejected": 0, "failed": 1, "dropped": 2, "note": 3}


def _verdicts(trials: list[Trial]) -> list[FamilyVerdicts]:
    by_fam: dict[str, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    reasons: dict[str, Counter] = defaultdict(Counter)
    example: dict[tuple[str, str, str], str] = {}
    seen: set[tuple] = set()
    for t in trials:
        pair = (t.problem_key, t.tactic_id)
        by_fam[t.family][pair].add(t.status)
        if not t.reason:
            continue
        st = "note" if t.status == "ok" else t.status   # an ok trial's reason is a note (model error)
        key = (t.family, st, reason_class(t.reason))
        if (key, pair) in seen:  # counted once per (problem, tactic), not once per bucket
            continue
        seen.add((key, pair))
        reasons[t.family][key[1:]] += 1
        example.setdefault(key, t.reason)
    out = []
    for fam in sorted(by_fam):
        pairs = by_fam[fam]
        rejected = sum(1 for s in pairs.values() if s == {"rejected"})
        kept = len(pairs) - rejected
        failed = sum(1 for s in pairs.values() if "failed" in s)
        ok = sum(1 for s in pairs.values() if "ok" in s)
        dropped = sum(1 for s in pairs.values() if "dropped" in s)
        groups = [ReasonGroup(st, example[(fam, st, c)], n)
                  for (st, c), n in sorted(reasons[fam].items(), key=lambda kv: (_ORDER.get(kv[0][0], 9), -kv[1], kv[0][1]))]
        out.append(FamilyVerdicts(fam, kept, rejected, failed, ok, dropped, groups))
    return out


def _point(p: Problem, w: Winner, default_label: str, fam_best: dict, baselines: dict[str, float],
           ceil: ceil_mod.Ceilings | None, fp4_native: bool, skew: float) -> Point:
    m = w.bucket
    flops = float(p.flops(m))
    nbytes = call_bytes(p, m, skew)      # under the routing draw the cache was measured with
    ai = intensity(p, m, skew)
    secs = w.median_us * 1e-6              # > 0: autotune.cache.rows.check_winner passed
    tfl = flops / secs / 1e12
    gbs = nbytes / secs / 1e9
    kind, peak = ceil.compute_for(p.a_fmt, p.w_fmt, fp4_native) if ceil else ("bf16", None)
    roof = None
    if ceil and ceil.bandwidth_gbs:
        roof = ceil.bandwidth_gbs * ai / 1e3
        if peak:
            roof = min(roof, peak)
    return Point(m, tactic_label(w.params_json), w.family, w.median_us, default_label, w.default_median_us, w.speedup,
                 {f: us for f, (us, _) in sorted(fam_best.items())}, baselines, flops, nbytes, ai, tfl, gbs, kind,
                 roof, (tfl / roof) if roof else None, bool(getattr(w, "replay_checked", False)))


def checked(rows: list, check) -> tuple[list, dict[str, int]]:
    """The rows that pass `check` (a autotune.cache.rows validator) and the count of the others by reason."""
    good, skipped = [], Counter()
    for r in rows:
        why = check(r)
        if why:
            skipped[why] += 1
        else:
            good.append(r)
    return good, dict(sorted(skipped.items()))


def skip_notes(skipped: dict[str, dict[str, int]]) -> list[str]:
    """One line per kind of row: 'skipped 2 winners that fail the row checks: bad bucket 1, ...'."""
    return [f"skipped {sum(c.values())} {kind} that fail the row checks: "
            + ", ".join(f"{r} {n}" for r, n in c.items()) for kind, c in skipped.items() if c]


def collect(store, problem_keys: set[str] | None = None, uses: list | None = None) -> Summary:
    """Everything the report and `autotune show` print, read from `store` (read-only use; a
    report.sources.StoreUnion reads several caches as one). Rows that fail autotune.cache.rows' checks are
    left out and counted (Summary.skipped, and a note each). `uses` (autotune.models.ProblemUse of
    the model asked for) names each problem's layers and runs per forward."""
    meta = store.meta()
    try:
        skew = measure.skew_of(meta)    # the routing draw the grouped times were measured under
    except ValueError as e:
        raise CacheError(str(e)) from None
    devices = store.device_records()
    winners, skip_w = checked(store.winners(), check_winner)
    trials, skip_t = checked(store.trials(), check_trial)
    misses, skip_m = checked(store.misses(), check_miss)
    skipped = {k: v for k, v in (("winners", skip_w), ("trials", skip_t), ("misses", skip_m)) if v}
    notes: list[str] = skip_notes(skipped)
    by_dev_w: dict[str, list[Winner]] = defaultdict(list)
    for w in winners:
        by_dev_w[w.device_key].append(w)
    by_dev_t: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        by_dev_t[t.device_key].append(t)
    dev_keys = sorted(set(by_dev_w) | set(by_dev_t), key=lambda k: (devices.get(k, {}).get("gpu_name", ""), k))
    views = [_device_view(store, meta, dk, devices.get(dk), by_dev_w.get(dk, []), by_dev_t.get(dk, []), misses,
                          problem_keys, uses, skew) for dk in dev_keys]
    unchecked = sum(not w.replay_checked for w in winners if problem_keys is None or w.problem_key in problem_keys)
    if unchecked:
        notes.append(f"{unchecked} winner(s) not replay-checked (stored before the replay check, or by a search "
                     f"whose executor had none): marked {NOT_REPLAYED!r}; `autotune verify` checks them as served")
    notes += list(getattr(store, "notes", ()))        # a StoreUnion's word on rows replaced
    if not views:
        notes.append("the cache holds no trials or winners" + (" for the selected problems" if problem_keys else ""))
    schema = meta.get("schema")
    return Summary(store.url, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                   int(schema) if schema and schema.isdigit() else None, meta, views, notes, skipped=skipped)


def _device_view(store, meta: dict, dk: str, rec: dict | None, dev_winners: list[Winner], dev_trials: list[Trial],
                 misses: list, problem_keys: set[str] | None, uses: list | None, skew) -> DeviceView:
    """One device's part of the report (of the selected problems and their baselines): a view per
    FP4 problem with the non-FP4 problems of its shape folded in as baselines (a baseline with no
    FP4 counterpart here is a problem of its own), verdicts, misses, library versions, decode step."""
    rec = rec or {"device_key": dk, "gpu_name": f"unknown device {dk}", "cc": "?"}
    arch = _arch_name(rec)
    fp4_native = ARCHS.get(arch) is not None and ARCHS[arch].fp4 == "native"
    ceil = ceil_mod.for_device(meta, dk, rec.get("gpu_name", ""))
    dtrials = [t for t in dev_trials if problem_keys is None or t.problem_key in problem_keys
               or _is_baseline_of(t.problem_key, problem_keys)]
    best = _best(dtrials)
    wins = [w for w in dev_winners if problem_keys is None or w.problem_key in problem_keys]
    shapes = _baseline_shapes(best, dev_winners)
    by_key = {u.problem.key: u for u in uses or ()}
    folded: set[str] = set()
    pviews = []
    for key in sorted({w.problem_key for w in wins}):
        view = _problem_view(store, key, wins, shapes, best, ceil, fp4_native, skew, by_key.get(key), arch)
        folded.update(view.baseline_keys)
        pviews.append(view)
    pviews = [v for v in pviews if v.key not in folded]
    libs = {}
    for t in dtrials:
        if t.lib_key not in libs:
            libs[t.lib_key] = _libset(store, t.lib_key)
    dmiss = [{"problem": m.problem_key, "m": m.m, "count": m.count} for m in misses
             if m.device_key == dk and (problem_keys is None or m.problem_key in problem_keys)]
    sv = step_view(pviews, uses, skew) if uses else None
    return DeviceView(dk, rec, arch, rec.get("cc") == "cpu", ceil.to_dict() if ceil else None,
                      pviews, _verdicts(dtrials), dmiss, libs,
                      with_ceilings(sv, ceil.to_dict() if ceil else None) if sv else None)


def _baseline_shapes(best: dict, dev_winners: list[Winner]) -> dict[tuple, list[str]]:
    """Shape -> the keys of the non-FP4 problems of that shape measured on this device (baselines)."""
    shapes: dict[tuple, list[str]] = defaultdict(list)
    for key in {k for k, _ in best} | {w.problem_key for w in dev_winners}:
        q = _problem(key)
        if q is not None and q.w_fmt not in BLOCK:
            shapes[_shape(q)].append(key)
    return shapes


def _problem_view(store, key: str, wins: list[Winner], shapes: dict[tuple, list[str]], best: dict, ceil,
                  fp4_native: bool, skew, use, arch: str) -> ProblemView:
    """One problem's winners per bucket beside its family default, the best of each family and (for
    an FP4 problem) the best of each baseline of its shape."""
    p = Problem.from_key(key)                 # parses: check_winner passed
    bkeys = sorted(shapes.get(_shape(p), [])) if p.w_fmt in BLOCK else []
    pts = []
    for w in sorted((w for w in wins if w.problem_key == key), key=lambda w: w.bucket):
        dflt = _tactic(store, w.default_tactic_id)
        base = {}
        for bk in bkeys:
            q = _problem(bk)
            for fam, (us, _) in best.get((bk, w.bucket), {}).items():
                base[f"{q.a_fmt}×{q.w_fmt} {fam}"] = us
        pts.append(_point(p, w, tactic_label(dflt.to_json()) if dflt else w.default_tactic_id,
                          best.get((key, w.bucket), {}), base, ceil, fp4_native, skew))
    return ProblemView(key, pts, bkeys, tuple(use.layers) if use else (), use.per_forward if use else None,
                       arch, {w.bucket: w.params_json for w in wins if w.problem_key == key})


def _tactic(store, tactic_id: str):
    try:
        return store.tactic(tactic_id)
    except (ValueError, TypeError, AttributeError):   # a damaged tactic row: shown by its id
        return None


def _libset(store, lib_key: str) -> dict:
    try:
        v = store.libset(lib_key)
    except (ValueError, TypeError):                   # damaged versions_json: shown as unknown
        return {}
    return v if isinstance(v, dict) else {}


def _is_baseline_of(key: str, problem_keys: set[str] | None) -> bool:
    """A non-FP4 problem with the shape of a selected FP4 problem (kept when filtering by model)."""
    q = _problem(key)
    if q is None or q.w_fmt in BLOCK or not problem_keys:
        return False
    return any(_shape(q) == _shape(p) for p in filter(None, map(_problem, problem_keys)))


def static_plans(problems: list[Problem], families: list, archs: list) -> list[ArchPlan]:
    """Verdicts of every tactic of `families` for `problems` on each arch, grouped by reason.
    Pure: the same pass as `autotune search --dry-run` (autotune.engine.search.plan)."""
    from autotune.engine.search import plan
    out = []
    for arch in archs:
        pairs: dict[str, list] = defaultdict(list)
        for p, rows in plan(problems, families, arch).items():
            for r in rows:
                pairs[r.tactic.family].append(r.verdict)
        fams = []
        for fam in sorted(pairs):
            vs = pairs[fam]
            rejected = [v for v in vs if v.ok is False]
            unknown = sum(1 for v in vs if v.ok is None)
            groups: Counter = Counter(reason_class(v.reason) for v in rejected)
            example = {}
            for v in rejected:
                example.setdefault(reason_class(v.reason), v.reason)
            fams.append(FamilyVerdicts(fam, sum(1 for v in vs if v.ok is True), len(rejected), 0, 0, 0,
                                       [ReasonGroup("rejected", example[c], n) for c, n in groups.most_common()],
                                       unknown))
        out.append(ArchPlan(arch.name, len(problems), fams))
    return out
