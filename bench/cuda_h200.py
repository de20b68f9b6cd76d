"""The cuda family on a CUDA GPU: correctness of every config, then the decode table.

    python3 bench/cuda_h200.py run --out DIR [--phases check,table] [--budget-s 400]
    python3 bench/cuda_h200.py render DIR/cuda_h200.json          # markdown tables, anywhere

`run` (one device command):
  check  every kept config of the cuda family at GLM-5's TP8 dense shapes, at M = 1, 13, 31, 64,
         100 (every M tile, ragged M, M > 64 on grid.y): NaN-poisoned output against the
         float64 reference (autotune.core.inputs.check); the NVRTC compile time, a second load from
         the disk cache, the loaded function's registers / local memory / shared memory; the bound
         (prepacked, `bind`) launcher and a CUDA-graph replay of it compared with the eager call.
  table  GLM-5 TP1 and TP8 dense problems at M = 1, 2, 4, 8, 16, 32, 64, every column with
         autotune.engine.timing.time_calls (input sets rotated past twice the L2, CUDA-graph
         replay): the cuda winner over its kept configs; the Triton winner over the distinct tactics
         the committed H200 cache (docs/data/h200-glm5-tp8.db) chose at M <= 64 (a quick run: the
         same short list on every shape); cuBLAS bf16 (torch.matmul on pre-dequantized weights); a
         device copy of the same bytes (FP4 elements + scales, same rotation, same timer).
Everything lands in DIR/cuda_h200.json; the tables are printed last.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import existing  # noqa: E402

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402

CHECK_M = (1, 13, 31, 64, 100)
TABLE_M = (1, 2, 4, 8, 16, 32, 64)
TRITON_DB = ROOT / "docs" / "data" / "h200-glm5-tp8.db"


def glm5_dense(tp: int) -> list[tuple[str, Problem]]:
    from autotune.models import problems_for
    return [(f"TP{tp} {u.layers[0].split('[')[0].replace('mlp.', '')}", u.problem)
            for u in problems_for("glm5", tp) if u.problem.kind == "dense"]


def triton_tactics(max_m: int = 64) -> list[Tactic]:
    """Distinct Triton winners of the committed H200 cache at M <= max_m."""
    con = sqlite3.connect(f"file:{TRITON_DB}?mode=ro", uri=True)
    cols = [r[1] for r in con.execute("PRAGMA table_info(tactics)")]
    wcols = [r[1] for r in con.execute("PRAGMA table_info(winners)")]
    tid = next(c for c in ("tactic_id", "id") if c in cols)
    wt = next(c for c in wcols if "tactic" in c and "default" not in c)
    bucket = next(c for c in wcols if "bucket" in c)
    pcol = next(c for c in cols if c in ("params", "params_json", "tactic_json", "json"))
    rows = con.execute(f"SELECT DISTINCT t.{pcol} FROM winners w JOIN tactics t ON t.{tid} = w.{wt} "
                       f"WHERE w.family = 'triton' AND w.{bucket} <= ?", (max_m,)).fetchall()
    out = []
    for (pj,) in rows:
        d = json.loads(pj)
        out.append(Tactic("triton", d.get("params", d)))
    return out


class Inputs:
    """Weights for a cold-L2 rotation, their bf16 copies (cuBLAS) and byte blobs (the copy)."""

    def __init__(self, p: Problem, seed: int, bf16: bool = True):
        import torch

        from autotune.core import inputs
        from autotune.engine import timing
        self.p = p
        gen = torch.Generator().manual_seed(seed)
        w0 = inputs.random_weight(p, "cuda", gen)
        self.nbytes = w0.packed.numel() + w0.scales.numel()
        self.n_sets = timing.sets_for_cold_l2(self.nbytes, "cuda", cap=16)
        self.w = [w0] + [inputs.random_weight(p, "cuda", gen) for _ in range(self.n_sets - 1)]
        self.wbf16 = [w.dequantize(torch.bfloat16) for w in self.w] if bf16 else []
        self.blobs = [torch.cat((w.packed.reshape(-1), w.scales.view(torch.uint8).reshape(-1))) for w in self.w]
        self.dst = [torch.empty_like(b) for b in self.blobs]

    def sets(self, m: int, seed: int):
        import torch

        from autotune.core import inputs
        g = torch.Generator(device="cuda").manual_seed(seed)
        return [inputs.InputSet(torch.randn(m, self.p.k, device="cuda", generator=g).to(torch.bfloat16), w)
                for w in self.w]


def kept(fam, p: Problem, arch) -> list[Tactic]:
    """Kept by the exact rules, also where `unknown` only for want of the GPU-check record (this
    bench checks every one against float64)."""
    from autotune.tactics.cuda.checked import awaiting_record
    return [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok or awaiting_record(fam.verdict(p, t, arch))]


# -- check ------------------------------------------------------------------------------------

def check_phase(res: dict, deadline: float) -> None:
    import torch

    from autotune.core import inputs
    from autotune.core.arch import detect
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda.family import CudaFamily, config
    fam, arch = CudaFamily(), detect()
    target = f"sm_{arch.cc_int}"
    out = res.setdefault("check", {"rows": [], "compile": [], "bound": []})
    # compile every variant once (the source does not depend on N, K): NVRTC time, cache reload
    configs = {config(t, mt) for _, p in glm5_dense(8) for t in kept(fam, p, arch) for mt in B.M_TILES}
    for c in sorted(configs, key=lambda c: (c.warps_k, c.stages, c.m_tiles)):
        t0 = time.perf_counter()
        path = B.nvrtc_cubin(c, target)
        t1 = time.perf_counter()
        B.nvrtc_cubin(c, target)
        t2 = time.perf_counter()
        row = {"config": c.__dict__, "nvrtc_s": t1 - t0, "cached_s": t2 - t1, "cubin": path.name}
        try:
            row["resources"] = dict(B.runtime_resources(B.load(c, target, 0)))
        except Exception as e:  # noqa: BLE001 - a refused config is a result
            row["error"] = f"{type(e).__name__}: {e}"
        out["compile"].append(row)
    for pi, (label, p) in enumerate(glm5_dense(8)):
        inp = Inputs(p, seed=10 + pi, bf16=False)
        for m in CHECK_M:
            if time.time() > deadline:
                res.setdefault("notes", []).append(f"check stopped at {label} M={m}")
                return
            s = inp.sets(m, seed=100 * pi + m)[0]
            ref = inputs.reference(p, s)
            for t in kept(fam, p, arch):
                r = {"problem": label, "key": p.key, "m": m, "tactic": t.params}
                try:
                    r["err"] = inputs.check(p, fam.build(p, t, "cuda"), s, ref)
                except Exception as e:  # noqa: BLE001
                    r["fail"] = f"{type(e).__name__}: {str(e)[:300]}"
                out["rows"].append(r)
        # the bound launcher on the prepacked layout, eager and graph-replayed
        t = fam.default(p, arch)
        packed = fam.pack(fam.layout(t), inp.w[0])
        launch = fam.bind(p, t, packed, "cuda")
        for m in (1, 16, 64):
            s = inp.sets(m, seed=7 + m)[0]
            ref = inputs.reference(p, s)
            err = inputs.check(p, lambda x, w, out: launch(x, out=out), s, ref)
            y = torch.full((m, p.n), float("nan"), dtype=torch.bfloat16, device="cuda")
            g = torch.cuda.CUDAGraph()
            launch(s.x, out=y)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                launch(s.x, out=y)
            y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            same = bool(torch.equal(y, launch(s.x)))
            out["bound"].append({"problem": label, "m": m, "err": err, "graph_equals_eager": same})


# -- table ------------------------------------------------------------------------------------

def _pre_one(args):
    fam_name, key, tj, arch = args
    from autotune.core.arch import get_arch
    from autotune.tactics import registry
    t0 = time.perf_counter()
    try:
        registry.get(fam_name).precompile(Problem.from_key(key), Tactic.from_json(tj), get_arch(arch))
        return None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported
        return f"{fam_name} {tj}: {type(e).__name__}: {str(e)[:160]}", time.perf_counter() - t0


def precompile(items: list, arch: str, procs: int = 16) -> dict:
    """Compile (family, problem key, tactic json) items in spawned processes before timing."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    t0 = time.perf_counter()
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as ex:
        res = list(ex.map(_pre_one, [(f, k, tj, arch) for f, k, tj in items]))
    return {"items": len(items), "wall_s": time.perf_counter() - t0, "errors": [r[0] for r in res if r[0]][:5]}


def _time(fn, n_sets: int, timer) -> float:
    from autotune.engine import timing
    return timing.time_calls(fn, n_sets, "cuda", timer).median_us


def table_phase(res: dict, deadline: float) -> None:
    from autotune.core import inputs
    from autotune.core.arch import detect
    from autotune.engine import timing
    from autotune.tactics.cuda.family import CudaFamily
    from autotune.tactics.triton_fp4.family import TritonFamily
    import torch
    cuda, tri, arch = CudaFamily(), TritonFamily(), detect()
    timer = timing.TimerConfig(budget_s=0.01, max_reps=10)
    ttac = triton_tactics()
    res["triton_tactics"] = [t.params for t in ttac]
    probs = glm5_dense(1) + glm5_dense(8)
    items = {("cuda", probs[0][1].key, t.to_json()) for t in cuda.enumerate(probs[0][1], arch)}
    items |= {("triton", p.key, t.to_json()) for _, p in probs for t in ttac if tri.verdict(p, t, arch).ok}
    res["precompile"] = precompile(sorted(items), arch.name)
    print("precompile", res["precompile"], flush=True)
    rows = res.setdefault("table", [])
    for pi, (label, p) in enumerate(probs):
        inp = Inputs(p, seed=200 + pi)
        copy_us = _time(lambda i: inp.dst[i].copy_(inp.blobs[i]), inp.n_sets, timer)
        kernels = {("cuda", t.id): (t, cuda.build(p, t, "cuda")) for t in kept(cuda, p, arch)}
        # the cuda kernels read their prepacked layout, made once per weight as at load (never timed)
        packed = {id(w): cuda.pack(cuda.layout(kept(cuda, p, arch)[0]), w) for w in inp.w}
        kernels.update({("triton", t.id): (t, tri.build(p, t, "cuda")) for t in ttac if tri.verdict(p, t, arch).ok})
        for m in TABLE_M:
            if time.time() > deadline:
                res.setdefault("notes", []).append(f"table stopped at {label} M={m}")
                return
            sets = inp.sets(m, seed=1000 * pi + m)
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            row = {"problem": label, "key": p.key, "m": m, "copy_us": copy_us, "bytes": inp.nbytes,
                   "sets": inp.n_sets}
            row["cublas_us"] = _time(lambda i: torch.matmul(sets[i].x, inp.wbf16[i].T, out=outs[i]), inp.n_sets, timer)
            best: dict[str, tuple[float, dict, float]] = {}
            fails = []
            for (fname, _), (t, k) in kernels.items():
                args = ((lambda i: (sets[i].x, packed[id(sets[i].w)])) if fname == "cuda"
                        else (lambda i: sets[i].args()))
                try:
                    err = inputs.check(p, k, sets[0], ref)
                    us = _time(lambda i: k(*args(i), out=outs[i]), inp.n_sets, timer)
                    row.setdefault("all", []).append([fname, t.params, us])
                except Exception as e:  # noqa: BLE001
                    fails.append(f"{fname} {t.params}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                if fname not in best or us < best[fname][0]:
                    best[fname] = (us, t.params, err)
            for fname, (us, params, err) in best.items():
                row[f"{fname}_us"], row[f"{fname}_tactic"], row[f"{fname}_err"] = us, params, err
            row["fails"] = fails[:5]
            rows.append(row)
            print(_line(row), flush=True)


def _line(r: dict) -> str:
    bw = lambda us: f"{2 * r['bytes'] / us / 1e3:.0f}" if us else "-"  # noqa: E731  (read+write GB/s)
    cu, tr, cb, cp = (r.get(k) for k in ("cuda_us", "triton_us", "cublas_us", "copy_us"))
    f = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
    pct = f"{100 * cp / (2 * cu):.0f} %" if cu else "-"      # bytes/cuda over copy's (read+write)/time
    tac = r.get("cuda_tactic") or {}
    cfg = f"{tac.get('warps_k', '-')}/{tac.get('stages', '-')}/{tac.get('tiles_n', '-')}"
    return (f"| {r['problem']} | {r['m']} | {f(cu)} | {cfg} | {f(tr)} | "
            f"{f(cb)} | {f(cp)} | {pct} | {f(cb / cu) if cu and cb else '-'}x | {f(tr / cu) if cu and tr else '-'}x |")


HEADER = ("| problem | M | cuda µs | warps_k/stages/tiles_n | triton µs | cuBLAS bf16 µs | copy µs | cuda % of copy BW | "
          "cuBLAS/cuda | triton/cuda |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")


def render(res: dict) -> str:
    lines = []
    if "check" in res:
        c = res["check"]
        bad = [r for r in c["rows"] if "fail" in r]
        errs = [r["err"] for r in c["rows"] if "err" in r]
        refused = [r for r in c["compile"] if "error" in r]
        lines.append(f"check: {len(c['rows'])} (problem, M, config) runs, {len(bad)} failed, max rel err "
                     f"{max(errs) if errs else float('nan'):.3g}; {len(c['compile'])} variants compiled, "
                     f"{len(refused)} refused; bound: {c['bound']}")
        for r in bad[:10]:
            lines.append(f"  FAIL {r['problem']} M={r['m']} {r['tactic']}: {r['fail']}")
        for r in refused[:10]:
            lines.append(f"  REFUSED {r['config']}: {r['error']}")
        nv = [r["nvrtc_s"] for r in c["compile"]]
        if nv:
            lines.append(f"  NVRTC per variant: median {statistics.median(nv):.2f} s, max {max(nv):.2f} s; "
                         f"cache reload max {max(r['cached_s'] for r in c['compile']) * 1e3:.1f} ms")
            regs = {json.dumps(r['config']): r.get('resources', {}).get('num_regs') for r in c['compile']}
            lines.append(f"  registers: {regs}")
    if res.get("table"):
        lines += [HEADER] + [_line(r) for r in res["table"]]
    return "\n".join(lines + res.get("notes", []))


def run(a) -> int:
    import torch
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "phases": a.phases}
    try:
        import cupy
        res["cupy"] = cupy.__version__
        from cupy.cuda import nvrtc
        res["nvrtc"] = list(nvrtc.getVersion())
    except ImportError as e:
        res["error"] = f"no CuPy: {e}"
    deadline = time.time() + a.budget_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for ph in a.phases.split(","):
            {"check": check_phase, "table": table_phase}[ph](res, deadline)
    finally:
        (out / "cuda_h200.json").write_text(json.dumps(res, indent=1, default=str))
        print(render(res))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--phases", default="check,table")
    r.add_argument("--budget-s", type=float, default=400.0)
    d = sub.add_parser("render")
    d.add_argument("json", type=existing)
    a = ap.parse_args()
    if a.cmd == "render":
        print(render(json.loads(Path(a.json).read_text())))
        return 0
    return run(a)


if __name__ == "__main__":
    raise SystemExit(main())
