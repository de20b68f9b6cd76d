"""The MLP decode step a user pays for: per M, the stored winners of every MLP layer of the model
times its layer count, by layer, beside the byte floor at the device's ceiling; and, when given,
the step measured by bench/moe_mlp_step_h200.py (its JSON) beside that estimate.

The routed experts run in one of their forms: where the cache holds the fused forms (w13+SwiGLU,
w2 with the top_k sum: what FP4MoE serves by default) with winners at as many buckets as the plain
ones, those; else the plain grouped GEMMs, whose SwiGLU and top_k sum are then in no column. The
shared expert is its own dense layers (the runtime's default; the folded `+shared` forms are left
out). Only buckets where every layer has a winner are shown, up to DECODE_MAX.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from autotune.core.measure import ROUTING_SKEW
from autotune.core.problem import Problem
from autotune.report.names import layer_label
from autotune.report.traffic import call_bytes

DECODE_MAX = 256      # decode batch sizes; prefill-sized M is the time pictures' business
KINDS = ("dense MLP", "shared expert", "routed experts")


@dataclass
class StepPart:
    kind: str                 # one of KINDS
    label: str                # 'mlp.experts.w13+swiglu [3–77] ×75'
    key: str                  # problem key
    count: int                # calls per forward
    us: dict[int, float]      # M -> winner µs per call
    bytes: dict[int, float]   # M -> minimum traffic of one call


@dataclass
class MeasuredStep:
    source: str
    gpu: str
    when: str
    total_us: dict[int, float]                 # M -> the measured step (µs)
    floor_us: dict[int, float]                 # M -> that run's byte floor at its own copy rate
    kinds: dict[int, dict[str, float]] = field(default_factory=dict)   # M -> kind -> µs (when they add up)
    note: str = ""


@dataclass
class StepView:
    buckets: list[int]
    parts: list[StepPart]
    bandwidth_gbs: float | None
    ceiling_stored: bool
    missing: list[str]                         # MLP layers without winners at any decode bucket
    measured: MeasuredStep | None = None

    def total_us(self, m: int) -> float:
        return sum(p.count * p.us[m] for p in self.parts)

    def floor_us(self, m: int) -> float | None:
        if not self.bandwidth_gbs:
            return None
        return sum(p.count * p.bytes[m] for p in self.parts) / (self.bandwidth_gbs * 1e9) * 1e6

    def by_kind(self, m: int) -> dict[str, float]:
        out = {k: 0.0 for k in KINDS}
        for p in self.parts:
            out[p.kind] += p.count * p.us[m]
        return {k: v for k, v in out.items() if v}


def _kind(name: str) -> str | None:
    base = name.split("[")[0]
    if base.startswith("mlp.shared_experts."):
        return "shared expert"
    if base.startswith("mlp.experts."):
        return "routed experts"
    if base.startswith("mlp."):
        return "dense MLP"
    return None


def step_view(problems: list, uses: list, skew: float = ROUTING_SKEW) -> StepView | None:
    """The estimate from one device's ProblemViews and the model's ProblemUses; None when the model
    has no MLP layers."""
    views = {v.key: v for v in problems}
    groups: dict[str, list] = {}                   # layer base name -> its candidate forms
    for u in uses:
        if not u.layers or not all(_kind(n) for n in u.layers):
            continue
        base, *mods = u.layers[0].split("[")[0].split("+")
        if "shared" in mods:                       # folded shared expert: not the runtime's default
            continue
        groups.setdefault(base, []).append(u)
    if not groups:
        return None

    def decode(u) -> set[int]:
        v = views.get(u.problem.key)
        return {p.bucket for p in v.points if p.bucket <= DECODE_MAX} if v else set()

    chosen, missing = [], []
    for base, forms in sorted(groups.items()):
        # most decode buckets first; on a tie the fused form (an epilogue), as FP4MoE serves it
        best = max(forms, key=lambda u: (len(decode(u)), u.problem.epilogue != "none"))
        if not decode(best):
            missing.append(layer_label(best.layers, best.per_forward, best.problem.key))
        else:
            chosen.append(best)
    common = sorted(set.intersection(*(decode(u) for u in chosen))) if chosen and not missing else []
    parts = []
    for u in sorted(chosen, key=lambda u: (KINDS.index(_kind(u.layers[0])), any(d in u.layers[0] for d in ("down", "w2")),
                                           u.layers)):
        v = views[u.problem.key]
        pts = {p.bucket: p for p in v.points}
        parts.append(StepPart(_kind(u.layers[0]), layer_label(u.layers, u.per_forward, u.problem.key),
                              u.problem.key, u.per_forward, {m: pts[m].winner_us for m in common},
                              {m: call_bytes(u.problem, m, skew) for m in common}))
    return StepView(common, parts if common else [], None, False, missing)


def with_ceilings(sv: StepView, ceilings: dict | None) -> StepView:
    if ceilings and ceilings.get("bandwidth_gbs"):
        sv.bandwidth_gbs = float(ceilings["bandwidth_gbs"])
        sv.ceiling_stored = bool(ceilings.get("stored"))
    return sv


class StepJsonError(ValueError):
    """A --step-json file that is not the MLP-step benchmark's output."""


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def load_measured(path: str | Path, uses: list) -> MeasuredStep:
    """bench/moe_mlp_step_h200.py's JSON: per M the step's total and floor (`step_fp4_us`,
    `step_floor_us`), split by layer kind with the model's layer counts where the benchmark's
    per-layer figures add up to its total with them (else totals only, and a note says so)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise StepJsonError(f"cannot read the step JSON {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise StepJsonError(f"{p} is not JSON: {e}") from None
    rows = d.get("step") if isinstance(d, dict) else None
    if not isinstance(rows, list) or not rows or not isinstance(d.get("gpu"), str):
        raise StepJsonError(f"{p} is not the MLP-step benchmark's JSON (no 'gpu' and 'step' rows)")
    total, floor, kinds = {}, {}, {}
    counts = _counts(uses)
    for r in rows:
        m = r.get("m") if isinstance(r, dict) else None
        if not (isinstance(m, int) and not isinstance(m, bool) and m > 0 and _pos(r.get("step_fp4_us"))):
            raise StepJsonError(f"{p}: a step row without a positive integer 'm' and a positive 'step_fp4_us': "
                                f"{str(r)[:80]}")
        total[m] = float(r["step_fp4_us"])
        if _pos(r.get("step_floor_us")):
            floor[m] = float(r["step_floor_us"])
        split = _split(r, counts)
        if split:
            kinds[m] = split
    note = ""
    if len(kinds) < len(total):
        kinds = {}
        note = ("its per-layer figures do not add up to its step with this model's layer counts "
                f"({', '.join(f'{k} {n}' for k, n in counts.items()) or 'none'}): shown as totals")
    return MeasuredStep(p.name, d["gpu"], str(d.get("when", "")), total, floor, kinds, note)


def _counts(uses: list) -> dict[str, int]:
    """Layers per forward of the dense MLP and of the MoE layers, from the model's plain layers."""
    out = {}
    for u in uses:
        if u.layers and "+" not in u.layers[0]:
            k = _kind(u.layers[0])
            if k == "dense MLP":
                out.setdefault("dense", u.per_forward)
            elif k is not None:
                out.setdefault("moe", u.per_forward)
    return out


_FIELDS = {"dense MLP": ("dense", ("gate_up_fp4", "down_fp4")),
           "shared expert": ("moe", ("shared_gate_up_fp4", "shared_down_fp4")),
           "routed experts": ("moe", ("routed_fp4",))}


def _split(r: dict, counts: dict[str, int]) -> dict[str, float] | None:
    out = {}
    for kind, (layers, cols) in _FIELDS.items():
        if layers not in counts or not all(_pos(r.get(c)) for c in cols):
            return None
        out[kind] = counts[layers] * sum(r[c] for c in cols)
    if not math.isclose(sum(out.values()), r["step_fp4_us"], rel_tol=1e-6):
        return None
    return out


def attach_measured(summary, ms: MeasuredStep) -> None:
    """Put the measured step beside the estimate of the device it was measured on (same GPU name)."""
    devs = [d for d in summary.devices if d.gpu_name == ms.gpu]
    if not devs:
        raise StepJsonError(f"{ms.source} was measured on {ms.gpu}; the cache has no results of that GPU "
                            f"(it has {', '.join(sorted({d.gpu_name for d in summary.devices})) or 'none'})")
    for d in devs:
        if d.step is None:
            raise StepJsonError(f"{ms.source}: the model has no MLP layers to set the measured step beside")
        d.step.measured = ms
