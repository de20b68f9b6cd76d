"""GLM-5 TP8's whole MLP decode step as ONE CUDA graph of all 78 layers, against its byte floor.

    python3 bench/mlp_step_graph.py --cache DB --out DIR [--ms 1,4,16,64] [--forms winners,triton]
    python3 bench/mlp_step_graph.py --render DIR/mlp-step-graph.json      # the markdown tables
    MLP_GRAPH_SMOKE=1 python3 bench/mlp_step_graph.py --out DIR           # CPU smoke (tiny, no graph)

The layers are what the runtime builds for `autotune search --model glm5 --tp 8` (3 dense MLPs, 75 MoE
layers of shared expert + routed experts), each from the public API (FP4Linear / FP4MLP, FP4MoE) with its
own random NVFP4 weights (≈ 51 GB: nothing stays in L2 from one replay to the next) and routing buffers.

Forms (which members serve the routed problems), one at a time: `winners` (the cache's winners as
stored) or a family name (the routed problems' winners re-chosen among that family's trials in a copy
of the cache; none at a bucket: the default serves). Per form, routing (uniform, skewed top-8: Gumbel
top-k over a Zipf popularity) and M: the step captured as one CUDA graph, ROUNDS replays each after
refilling x and every layer's routing (outside the timing), CUDA events around the replay, the median;
the byte floor of each replay (FP4 weight + scale bytes it touches + activations) at the copy rate
measured in the same run (bench/harness.py copy_rate); per-kernel times of PROFILE replays; eager host
µs per FP4MoE forward and its device syncs; Dispatcher.routing_errors() after each routing (none).
--mlp linear | fp4mlp | fold: the dense and shared-expert MLPs as FP4Linear + SiLU·up + FP4Linear, as
FP4MLP, or FP4MLP dense layers with each shared expert folded into its FP4MoE (FP4MoE(shared=...)).
Writes DIR/mlp-step-graph.json after every (form, routing); prints one line per row and the table last.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402
from bench.harness import existing, is_sync_warning, profile_kernels  # noqa: E402

from autotune.core.problem import Problem  # noqa: E402
from autotune.runtime import onecopy  # noqa: E402

SMOKE = os.environ.get("MLP_GRAPH_SMOKE") == "1"
DEV, ROUNDS, PROFILE, EAGER_CALLS = ("cpu", 2, 0, 2) if SMOKE else ("cuda", 20, 3, 30)
SKEW = 1.2


def _count(layers: tuple[str, ...]) -> int:
    """Layers named like "mlp.experts.w13[3-77]" or "x[0-2, 5]" → how many."""
    n = 0
    for name in layers:
        m = re.search(r"\[([^\]]*)\]$", name)
        for part in (m.group(1).split(",") if m else ["0"]):
            a, _, b = part.strip().partition("-")
            n += int(b or a) - int(a) + 1
    return n


def plan(model: str, tp: int) -> dict:
    """The step's layer kinds from the preset: dense MLP (gate_up, down), MoE (shared gate_up, shared
    down, routed w13 and w2) with their problems and layer counts."""
    from autotune.models import problems_for
    uses = problems_for(model, tp=tp)
    by = {}
    for u in uses:
        name = u.layers[0]
        kind = ("shared_gate_up" if "shared_experts.gate_up" in name else "shared_down" if "shared_experts.down" in name
                else "w13" if ".w13" in name else "w2" if ".w2" in name else "gate_up" if "gate_up" in name
                else "down" if "down" in name else None)
        if kind is not None:
            by[kind] = (u.problem, _count(u.layers))
    need = {"gate_up", "down", "shared_gate_up", "shared_down", "w13", "w2"}
    if set(by) != need:
        raise SystemExit(f"{model} TP{tp}: expected the layer kinds {sorted(need)}, the preset gives {sorted(by)}")
    if not (by["gate_up"][1] == by["down"][1] and by["w13"][1] == by["w2"][1] == by["shared_gate_up"][1]
            == by["shared_down"][1]):
        raise SystemExit(f"{model} TP{tp}: layer counts do not pair up: {({k: v[1] for k, v in by.items()})}")
    return by


def tiny_plan() -> dict:
    w13, w2 = Problem.moe(64, 128, 6, 2), Problem.moe(128, 32, 6, 2)
    return {"gate_up": (Problem.dense(128, 128), 1), "down": (Problem.dense(128, 64), 1),
            "shared_gate_up": (Problem.dense(64, 128), 2), "shared_down": (Problem.dense(128, 32), 2),
            "w13": (w13, 2), "w2": (w2, 2)}


def family_cache(src: str | None, family: str, tmp: str) -> str | None:
    """A copy of `src` whose grouped-MoE winners are re-chosen among `family`'s ok trials (none: the
    winner row is dropped and the default serves). The dense winners stay."""
    if family == "winners" or src is None:
        return src
    from autotune.cache import Store
    from autotune.core.records import Winner
    dst = os.path.join(tmp, f"{family}.db")
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    a.backup(b)
    a.close(), b.close()
    st = Store(dst)
    for w in st.winners():
        if Problem.from_key(w.problem_key).kind != "grouped_moe" or w.family == family:
            continue
        ok = [t for t in st.get_trials(w.problem_key, w.bucket, w.device_key)
              if t.status == "ok" and t.family == family and t.median_us]
        st.delete_winner(w.problem_key, w.bucket, w.device_key)
        if ok:
            t = min(ok, key=lambda t: (t.median_us, t.tactic_id))
            d = w.default_median_us
            st.put_winner(Winner(w.problem_key, w.bucket, w.device_key, t.tactic_id, t.family, t.params_json,
                                 t.lib_key, t.median_us, w.default_tactic_id, d, (d / t.median_us) if d else None,
                                 t.code_key))
    st.close()
    return dst


class Step:
    """The 78 layers of one form, their static inputs, and the step as one callable."""

    def __init__(self, kinds: dict, d, max_m: int, seed: int, mlp: str = "linear"):
        import torch
        from autotune.core import inputs
        from autotune.runtime.moe import FP4MoE
        from autotune.runtime.nn import FP4MLP, FP4Linear
        self.kinds, self.d = kinds, d
        g = torch.Generator(device=DEV).manual_seed(seed)
        w = lambda k: inputs.random_weight(kinds[k][0], DEV, g)  # noqa: E731

        def pair(gu: str, dn: str):
            # linear: FP4Linear gate_up, SiLU·up in torch, FP4Linear down; fp4mlp: FP4MLP (the dense
            # SwiGLU problem writes silu(gate)·up itself: two kernels)
            if mlp == "fp4mlp":
                return (FP4MLP(w(gu), w(dn), dispatcher=d), None)
            return (FP4Linear(w(gu), dispatcher=d), FP4Linear(w(dn), dispatcher=d))
        w13p = kinds["w13"][0]
        fold = mlp == "fold"  # FP4MLP dense layers; the shared expert folded into the routed calls (e257:top9)
        mlp = "fp4mlp" if fold else mlp
        self.dense = [pair("gate_up", "down") for _ in range(kinds["gate_up"][1])]
        if fold:
            self.moe = [(None, None, FP4MoE(w("w13"), w("w2"), w13p.top_k, dispatcher=d,
                                            shared=(w("shared_gate_up"), w("shared_down")), fold_shared=True))
                        for _ in range(kinds["w13"][1])]
        else:
            self.moe = [(*pair("shared_gate_up", "shared_down"), FP4MoE(w("w13"), w("w2"), w13p.top_k, dispatcher=d))
                        for _ in range(kinds["w13"][1])]
        self.hidden, self.top_k, self.experts = w13p.k, w13p.top_k, w13p.experts
        self.x = torch.zeros(max_m, self.hidden, dtype=torch.bfloat16, device=DEV)
        self.ids = [torch.zeros(max_m, self.top_k, dtype=torch.int32, device=DEV) for _ in self.moe]
        self.tw = [torch.zeros(max_m, self.top_k, dtype=torch.float32, device=DEV) for _ in self.moe]
        self.pop = [torch.rand(self.experts, generator=g, device=DEV).argsort().float() for _ in self.moe]

    @staticmethod
    def _mlp(gate_up, down, x):
        import torch
        if down is None:                 # FP4MLP
            return gate_up(x)
        h = gate_up(x)
        i = h.shape[1] // 2
        return down(torch.nn.functional.silu(h[:, :i]) * h[:, i:])

    def __call__(self, m: int) -> list:
        x = self.x[:m]
        outs = [self._mlp(gu, dn, x) for gu, dn in self.dense]
        for (gu, dn, moe), ids, tw in zip(self.moe, self.ids, self.tw):
            y = moe(x, ids[:m], tw[:m])
            outs.append(y if gu is None else y + self._mlp(gu, dn, x))
        return outs

    def refill(self, m: int, skew: float) -> float:
        """Fresh x and routing for every layer; returns the experts touched (summed over layers)."""
        import torch
        self.x[:m].normal_()
        touched = 0
        for ids, tw, rank in zip(self.ids, self.tw, self.pop):
            # Gumbel top-k over log-popularity: top_k distinct experts, P ∝ popularity; skew 0 = uniform
            logits = -skew * torch.log1p(rank) + -torch.log(-torch.log(torch.rand(m, self.experts, device=DEV)))
            pick = logits.topk(self.top_k, dim=1).indices
            ids[:m].copy_(pick.to(torch.int32))
            w_ = torch.rand(m, self.top_k, device=DEV) + 0.1
            tw[:m].copy_(w_ / w_.sum(1, keepdim=True))
            touched += int(torch.unique(pick).numel())
        return touched

    def floor_bytes(self, m: int, touched: int) -> float:
        def fp4(p: Problem, experts: float = 1.0) -> float:
            return experts * p.n * (p.k // 2 + p.k // p.block)
        def act(p: Problem) -> float:
            return 2.0 * m * (p.k + p.n)
        k = self.kinds
        dense = k["gate_up"][1] * sum(fp4(k[n][0]) + act(k[n][0]) for n in ("gate_up", "down"))
        shared = k["w13"][1] * sum(fp4(k[n][0]) + act(k[n][0]) for n in ("shared_gate_up", "shared_down"))
        routed = fp4(k["w13"][0], touched) + fp4(k["w2"][0], touched) + k["w13"][1] * 2.0 * m * 2 * self.hidden
        return dense + shared + routed

    def served(self, ms) -> dict:
        """(problem key → {M: "rung family[params]"}) for every problem of the step."""
        def of(m) -> list:
            return [m.problem] if hasattr(m, "problem") else [m.gate_up.problem, m.down.problem]
        probs = {*[p for mod in (*self.dense[0], *self.moe[0][:2]) if mod is not None for p in of(mod)],
                 self.moe[0][2].problem13, self.moe[0][2].problem2}
        # a one-copy binding runs another tactic on the rungs whose winner reads another layout: say so
        moe = self.moe[0][2]
        subs = {bt.table.problem: {b: used for b, _, used in bt.substituted} for bt in (moe.bound13, moe.bound2)}
        out = {}
        for p in sorted(probs, key=lambda p: p.key):
            row = {}
            for m in ms:
                rung, t = self.d.rung_for(p, m)
                b = next((x for x in self.d.table(p).buckets if x >= m), None)
                used = subs.get(p, {}).get(b)
                row[str(m)] = f"{rung} {t}" + (f" -> one copy runs {used}" if used is not None else "")
            out[p.key] = row
        lr = moe.layer_route            # the whole-layer route: one launch where the layer problem's winner is one
        if lr is not None and lr.problem is not None:
            out[lr.problem.key] = {str(m): ("one launch" if lr.for_m(m, moe.bound13, moe.bound2) else "the pair") + " ({} {})"
                                   .format(*self.d.rung_for(lr.problem, m)) + f"; {lr.skipped.get(m, '')}" for m in ms}
        return out


def _sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def time_step(step: Step, m: int, skew: float, rate: float) -> dict:
    for _, _, moe in step.moe:
        moe.warmup([m])
    step.refill(m, skew)
    step(m)
    _sync()
    graph = None
    if DEV == "cuda":
        graph = harness.capture_graph(lambda: step(m))
    samples, floors = [], []
    for _ in range(ROUNDS):
        touched = step.refill(m, skew)
        _sync()
        run = graph.replay if graph is not None else (lambda: step(m))      # CPU smoke: eager, no graph
        samples.append(harness.time_us(lambda i: run(), device=DEV, reps=1, warmup=0, eager=True)["median_us"])
        floors.append(step.floor_bytes(m, touched) / rate * 1e6)
    row = {"m": m, "step_us": statistics.median(samples), "samples": len(samples),
           "floor_us": statistics.median(floors),
           "kernels": profile_kernels(graph.replay, PROFILE) if graph is not None and PROFILE else []}
    row["x_floor"] = row["step_us"] / row["floor_us"]
    row.update(eager(step, m))
    del graph
    return row


def eager(step: Step, m: int) -> dict:
    """Host µs per eager FP4MoE forward (one layer; device synced only before and after the loop)
    and the device syncs one eager forward makes."""
    import torch
    gu, dn, moe = step.moe[0]
    x, ids, tw = step.x[:m], step.ids[0][:m], step.tw[0][:m]
    moe(x, ids, tw)
    _sync()
    t0 = time.perf_counter()
    for _ in range(EAGER_CALLS):
        moe(x, ids, tw)
    t1 = time.perf_counter()
    _sync()
    syncs = None
    if DEV == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                moe(x, ids, tw)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum(is_sync_warning(w) for w in caught)
        _sync()
    return {"eager_host_us": (t1 - t0) / EAGER_CALLS * 1e6, "eager_syncs": syncs}


#: GPU memory (GiB) under which --one-copy auto serves one layout per weight: the H200's 141 GB held the
#: 78 layers with a copy per layout the winners read; an H100's 80 GB did not (77 GiB allocated)
ONE_COPY_BELOW_GIB = 100


def copy_rate() -> float:
    return 1e10 if SMOKE else harness.copy_rate()       # the same measurement as the kernel benches


def render(path: Path) -> str:
    r = json.loads(path.read_text())
    out = [f"{r['gpu']}, torch {r['torch']}, Triton {r['triton']}, {r['when']}; copy rate "
           f"{r['copy_Bps'] / 1e12:.2f} TB/s (read + written); {r['layers']} layers, "
           + ("one layout per weight (one_copy), " if r.get("one_copy") else "")
           + ("one CUDA graph per M" if r["gpu"] != "cpu" else "CPU smoke: eager, no graph")
           + f"; median of {r['rows_per_m']} replays, fresh x and routing before each.", "",
           "| form | MLPs | routing | w2 prefetch | M | step | byte floor | × floor | eager host µs / FP4MoE forward | syncs / forward |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for f in r["forms"]:
        for x in f["rows"]:
            pf = "on" if f.get("prefetch") else "off"
            out.append(f"| {f['form']} | {f.get('mlp', 'linear')} | {f['routing']} | {pf} | {x['m']} | {x['step_us'] / 1e3:.3f} ms | "
                       f"{x['floor_us'] / 1e3:.3f} ms | {x['x_floor']:.2f} | {x['eager_host_us']:.0f} | "
                       f"{'-' if x['eager_syncs'] is None else x['eager_syncs']} |")
    for f in r["forms"]:
        for x in f["rows"][:1]:
            if x["kernels"]:
                out += ["", f"Kernels per step, {f['form']}, {f['routing']}, M = {x['m']} (torch profiler):", ""]
                out += [f"* {k['us']:.1f} µs, {k['launches']:.0f} launches: `{k['kernel'][:80]}`" for k in x["kernels"][:10]]
    return "\n".join(out)


def main() -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--cache", type=existing, help="a cache with winners for the step's problems [default: none]")
    ap.add_argument("--out", help="where mlp-step-graph.json goes")
    ap.add_argument("--ms", default="1,4,16,64" if not SMOKE else "1,3")
    ap.add_argument("--forms", default="winners,triton", help="winners and/or family names for the routed problems")
    ap.add_argument("--routing", default="uniform,skewed")
    ap.add_argument("--mlp", default="linear", help="linear (FP4Linear + SiLU·up + FP4Linear), fp4mlp (FP4MLP), fold "
                    "(FP4MLP dense layers, the shared expert folded into FP4MoE: its e257:top9 problems, tuned with "
                    "`autotune search --fold-shared`), comma-separated: the dense and shared-expert MLPs")
    ap.add_argument("--prefetch", default="0", help="FP4MoE.prefetch_w2 values to time, e.g. 0,1: each M with w13 "
                    "putting w2's routed slices into L2 off, then on (the same layers, one graph each)")
    ap.add_argument("--one-copy", default="auto", choices=("auto", "0", "1"),
                    help="serve every M of a weight from one layout (Dispatcher one_copy): 1 on, 0 off, auto on "
                    "where the GPU holds less than ONE_COPY_BELOW_GIB (an H100: the 78 layers with a copy per "
                    "layout the winners read did not fit 80 GB)")
    ap.add_argument("--one-copy-upto", default="step", help="with one copy, the largest M whose rungs choose the "
                    "layout: step (the largest --ms), runtime (the Dispatcher's default, onecopy.DECODE_UPTO: the "
                    "documented engine recipe `Dispatcher(cache, one_copy=True)`), or a number")
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--render", type=existing, help="print the markdown tables of a result JSON and exit")
    a = ap.parse_args()
    if a.render:
        print(render(Path(a.render)))
        return 0
    if not a.out:
        ap.error("--out is required (or --render)")
    import torch
    import triton
    from autotune.runtime.dispatch import Dispatcher
    kinds = tiny_plan() if SMOKE else plan(a.model, a.tp)
    ms = [int(v) for v in a.ms.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp()
    res = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "cache": a.cache, "copy_Bps": copy_rate(), "layers": kinds["gate_up"][1] + kinds["w13"][1],
           "problems": {k: [p.key, n] for k, (p, n) in kinds.items()}, "rows_per_m": ROUNDS, "forms": []}
    one_copy = a.one_copy == "1" or (a.one_copy == "auto" and DEV == "cuda"
                                      and torch.cuda.get_device_properties(0).total_memory < ONE_COPY_BELOW_GIB * 2**30)
    if a.one_copy_upto not in ("step", "runtime") and not a.one_copy_upto.isdigit():
        ap.error(f"--one-copy-upto takes step, runtime or a number, got {a.one_copy_upto!r}")
    upto = {"step": max(ms), "runtime": None}.get(a.one_copy_upto, None if not a.one_copy_upto.isdigit()
                                                   else int(a.one_copy_upto))
    res["one_copy"] = one_copy
    res["one_copy_upto"] = (upto if upto is not None else onecopy.DECODE_UPTO) if one_copy else None
    bad = 0
    t0 = time.time()
    for form, mlp in ((f, m) for f in a.forms.split(",") for m in a.mlp.split(",")):
        # one copy: the layout chosen by the rungs up to --one-copy-upto (the step's M by default), not by every rung
        d = Dispatcher(family_cache(a.cache, form, tmp) or os.path.join(tmp, "none.db"), record_misses=False,
                       warn=False, one_copy=one_copy, one_copy_upto=upto if one_copy else None)
        step = Step(kinds, d, max(ms), seed=1, mlp=mlp)
        pfs = [bool(int(v)) for v in a.prefetch.split(",")]
        for routing in a.routing.split(","):
            skew = {"uniform": 0.0, "skewed": SKEW}[routing]
            rows: dict[bool, list] = {pf: [] for pf in pfs}
            for m in ms:
                for pf in pfs:            # the same layers and M, the prefetch off then on: one run's columns
                    for _, _, moe in step.moe:
                        moe.prefetch_w2 = pf
                    try:
                        rows[pf].append(time_step(step, m, skew, res["copy_Bps"]))
                        print(json.dumps({"form": form, "mlp": mlp, "routing": routing, "prefetch": pf,
                                          **{k: v for k, v in rows[pf][-1].items() if k != "kernels"}}), flush=True)
                    except Exception as e:  # noqa: BLE001 - recorded as the row, the run goes on
                        bad += 1
                        print(f"{form} {routing} prefetch={pf} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            errs = d.routing_errors()      # the sticky bad-id words of every layer: none for these ids
            bad += bool(errs)
            for pf in pfs:
                res["forms"].append({"form": form, "mlp": mlp, "routing": routing, "prefetch": pf,
                                     "served": step.served(ms), "rows": rows[pf], "routing_errors": errs})
            (out / "mlp-step-graph.json").write_text(json.dumps(res, indent=1))
        del step, d
        import gc
        gc.collect()          # del + empty_cache alone left the first form resident (the second ran out of memory on the H200); reference cycles are the likely holder
        if DEV == "cuda":
            torch.cuda.empty_cache()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    print(render(out / "mlp-step-graph.json"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
