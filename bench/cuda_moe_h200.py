"""The cuda family's grouped-MoE kernel (moe_mma, issue #26 stage 1) on one GPU, in one run:
its GPU tests, a float64 check of every timed config, and a per-kernel table at GLM-5 TP8 routed
shapes beside the Triton `moe_decode` member and the byte time at the copy rate of the same run.

    python3 bench/cuda_moe_h200.py --out $OUT [--budget-s 150 --tests-s 80]   # on the GPU machine (CuPy, Triton)
    python3 bench/cuda_moe_h200.py --plan                           # the cases, checked by the verdicts (CPU)
    python3 bench/cuda_moe_h200.py --render $OUT/cuda_moe.json     # the markdown table of a result
    CUDA_MOE_SMOKE=1 TRITON_INTERPRET=1 python3 bench/cuda_moe_h200.py --out DIR   # CPU smoke (~2 min)

Problems (E = 256, top-8, uniform routing; NVFP4 timed, MXFP4 checked): w13 N=512 K=6144 (plain and
the SwiGLU variant), w2 N=6144 K=256 with routing weights (plain, and the top_k-summing reduce
variant with one x row per pair); M = 1, 4, 16, 64.

1. `pytest -q tests/test_cuda_moe_gpu.py` in a subprocess (its own CUDA context: a fault there
   cannot poison the timings), its summary line kept.
2. The copy rate: a 1 GiB device-to-device copy, bytes read + written, median of 20.
3. Every candidate config (cuda `moe_mma` and, for w2_reduce, `moe_tok`; Triton) at every M against float64 (NaN-poisoned output, a -1
   slot at M > 1); a failure is one line and the config is not timed.
4. Timings with autotune.engine.timing.time_calls: CUDA-graph replay of one call per input set,
   sets with distinct weights (a pool of 3 E=256 expert sets) and fresh random x and routing,
   rotated past twice the L2, medians. Floor = touched experts' FP4 bytes (+ scales) + x + y +
   routing at the copy rate.
Writes $OUT/cuda_moe.json after every phase; prints one line per failure and the table last.
Exit status 1 when a test, a check or a case failed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402

#: CUDA_MOE_SMOKE=1 TRITON_INTERPRET=1: the whole script on the CPU at toy shapes, the cuda kernel
#: replaced by its CPU grid port (tests/families/cuda_moe_cpu.py), Triton interpreted: the
#: plumbing (checks, timings, JSON, table) is exercised, no GPU number comes out
SMOKE = os.environ.get("CUDA_MOE_SMOKE") == "1"
DEV = "cpu" if SMOKE else "cuda"
E, TOP_K = (256, 8) if not SMOKE else (6, 2)
MS = (1, 4, 16, 64) if not SMOKE else (1, 3)
W13 = Problem.moe(512, 6144, E, TOP_K) if not SMOKE else Problem.moe(64, 512, E, TOP_K)
W2 = Problem.moe(6144, 256, E, TOP_K) if not SMOKE else Problem.moe(128, 256, E, TOP_K)
#: variant -> (problem, routing weights passed)
VARIANTS = {"w13": (W13, False), "w2": (W2, True), "w13_swiglu": (W13.variant("swiglu"), False),
            "w2_reduce": (W2.variant("reduce"), True)}
POOL = 3           # distinct weight sets per problem (each E = 256 experts: 0.4 GB)
MAX_SETS = 12

# cuda candidates: (warps_k, split_k, tiles_n, m_tiles, stages); the family default is added
CUDA_CANDS = {
    "w13": [(4, 4, 1, 1, 4), (8, 2, 1, 1, 2), (8, 1, 1, 1, 2), (4, 2, 2, 1, 2), (2, 8, 1, 1, 4), (4, 4, 2, 1, 2),
            (4, 1, 1, 1, 4), (2, 4, 1, 2, 4), (8, 2, 2, 1, 2)],
    "w2": [(2, 1, 1, 1, 2), (2, 1, 2, 1, 2), (2, 1, 4, 1, 2), (1, 2, 1, 1, 2), (1, 2, 2, 1, 4), (1, 2, 4, 1, 2),
           (1, 1, 4, 1, 4), (2, 1, 4, 2, 2)],
    "w13_swiglu": [(4, 4, 2, 1, 2), (8, 2, 2, 1, 2), (2, 8, 2, 1, 4), (4, 2, 4, 1, 2)],
    "w2_reduce": [(2, 1, 1, 1, 2), (2, 1, 4, 1, 2), (1, 2, 2, 1, 4), (1, 2, 4, 1, 2)],
}
# moe_tok candidates (the token-major reduce kernel): (warps_k, stages, tiles_n)
TOK_CANDS = {"w2_reduce": [(1, 2, 1), (1, 4, 2), (2, 4, 2), (1, 8, 1), (1, 8, 2), (2, 2, 4)]}
# Triton moe_decode candidates: its tuned winners at these shapes in docs/moe-decode.md (M = 1 and M >= 16
# for w13, every M for w2), compiled at their first launch (both routes: M = 64 is 512 pairs, aligned)
_TRI = lambda bn, bk, sk, st: dict(kernel="moe_decode", route="direct", block_m=16, block_n=bn, block_k=bk,  # noqa: E731
                                    split_k=sk, num_warps=4, num_stages=st)
TRITON_CANDS = {
    "w13": [_TRI(128, 256, 8, 4), _TRI(128, 256, 2, 3)],
    "w2": [_TRI(128, 128, 1, 3)],
    "w13_swiglu": [_TRI(128, 256, 8, 4), _TRI(128, 256, 2, 3)],
    "w2_reduce": [_TRI(128, 128, 1, 3)],
}
MX_CHECK_MS = (1, 16)
OFF_SLOT = min(3, TOP_K - 1)      # the slot routed off the rank (-1) at M > 1 in the checks


def cuda_tactics(name: str, prob: Problem, arch) -> list[Tactic]:
    from autotune.tactics.cuda.family import CudaFamily
    fam = CudaFamily()
    out = [fam.default(prob, arch)]
    for wk, sk, tn, mt, st in CUDA_CANDS[name]:
        t = Tactic("cuda", kernel="moe_mma", warps_k=wk, stages=st, tiles_n=tn, m_tiles=mt, split_k=sk)
        if t not in out:
            out.append(t)
    for wk, st, tn in TOK_CANDS.get(name, ()):
        out.append(Tactic("cuda", kernel="moe_tok", warps_k=wk, stages=st, tiles_n=tn))
    return out


def short(t) -> str:
    if isinstance(t, Tactic) and t.params.get("kernel") == "moe_tok":
        return f"tok wk{t['warps_k']} tn{t['tiles_n']} st{t['stages']}"
    if isinstance(t, Tactic):
        return f"wk{t['warps_k']} sk{t['split_k']} tn{t['tiles_n']} mt{t['m_tiles']} st{t['stages']}"
    return f"{t['route'][0]} {t['block_m']}x{t['block_n']}x{t['block_k']} s{t['split_k']} st{t['num_stages']}"


def cuda_verdict(prob, t, arch):
    """The member's exact verdict: through the family a kept moe_mma tactic reads `unknown` until the
    kernel's text has passed its GPU tests (moe.gpu_checked, gpu_checked.json), and this run is that check."""
    from autotune.tactics.cuda import moe as MOE
    return MOE.verdict(prob, t, arch)


def plan() -> int:
    """The cases and the verdict of each cuda candidate on sm_90 (CPU: no GPU, no CuPy needed)."""
    from autotune.core.arch import get_arch
    from autotune.tactics.cuda.family import CudaFamily
    from autotune.tactics.triton_fp4 import moe_decode as md
    arch, fam, bad = get_arch("sm90"), CudaFamily(), 0
    for name, (prob, routed) in VARIANTS.items():
        for t in cuda_tactics(name, prob, arch):
            v = cuda_verdict(prob, t, arch)
            bad += not v.ok
            print(f"{name:11s} cuda   {short(t):28s} {'kept' if v.ok else 'REJECTED: ' + v.reason} smem {v.smem_bytes}")
        for c in TRITON_CANDS[name]:
            v = md.verdict(prob, c, arch)
            bad += not v.ok
            print(f"{name:11s} triton {short(c):28s} {'kept' if v.ok else 'REJECTED: ' + v.reason}")
    return 1 if bad else 0


def run_tests(budget_s: float) -> dict:
    t0 = time.time()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda_moe_gpu.py"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
        tail = (r.stdout + r.stderr).strip().splitlines()
        res = {"rc": r.returncode, "summary": tail[-1] if tail else "", "tail": tail[-40:]}
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        res = {"rc": 124, "summary": f"timed out after {budget_s:.0f} s", "tail": out.splitlines()[-40:]}
    res["s"] = round(time.time() - t0, 1)
    res["command"] = " ".join(cmd[1:])
    return res


def copy_rate() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, read + written (moe_decode's bench's)."""
    from bench.moe_decode_h200 import copy_rate as rate
    return rate()


def routing(m: int, seed: int, off: bool):
    import torch
    from autotune.core.inputs import routing as draw
    ids, tw = draw(m, E, TOP_K, torch.Generator().manual_seed(seed), skew=0.0)     # uniform top-8
    if off and m > 1:
        ids[m // 2, OFF_SLOT] = -1
    return ids.to(DEV), tw.to(DEV)


def context_alive() -> bool:
    from autotune.engine.worker import context_usable
    return context_usable(DEV)


def sync() -> None:
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:200] if msg else ''}"


def render(path: Path) -> str:
    res = json.loads(path.read_text())
    lines = [f"{res.get('gpu')}, torch {res.get('torch')}, Triton {res.get('triton')}, CuPy {res.get('cupy')}, "
             f"{res.get('when')}; copy {res.get('copy_Bps', 0) / 1e12:.2f} TB/s, L2 {res.get('l2_bytes', 0) / 2**20:.0f} MiB; "
             f"GPU tests: {res.get('tests', {}).get('summary')}", "",
             "| variant | M | experts touched | floor µs | cuda best µs | cuda config | ×floor | cuda default µs "
             "| triton best µs | triton config | triton/cuda |", "|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    f = lambda v, s="{:.1f}": "—" if v is None else s.format(v)  # noqa: E731
    for r in res.get("rows", []):
        cb, tb = r.get("cuda_best_us"), r.get("triton_best_us")
        lines.append(f"| {r['variant']} | {r['m']} | {r['touched']:.1f} | {r['floor_us']:.1f} | {f(cb)} | "
                     f"{r.get('cuda_best', '—')} | {f(cb / r['floor_us'] if cb else None, '{:.2f}')} | "
                     f"{f(r.get('cuda_default_us'))} | {f(tb)} | {r.get('triton_best', '—')} | "
                     f"{f(tb / cb if cb and tb else None, '{:.2f}')} |")
    m1 = {r["variant"]: r for r in res.get("rows", []) if r["m"] == 1}
    if "w13" in m1 and "w2" in m1 and m1["w13"].get("cuda_best_us") and m1["w2"].get("cuda_best_us"):
        tot = m1["w13"]["cuda_best_us"] + m1["w2"]["cuda_best_us"]
        t13, t2 = m1["w13"].get("triton_best_us"), m1["w2"].get("triton_best_us")
        tri = f"{t13 + t2:.1f} µs" if t13 and t2 else "not timed"
        lines += ["", f"Routed MoE at M = 1 (w13 + w2, cuda best): {tot:.1f} µs (stage-1 target ≤ 14 µs; "
                      f"Triton moe_decode best in this run: {tri})"]
    if m1.get("w13_swiglu", {}).get("cuda_best_us") and m1.get("w2_reduce", {}).get("cuda_best_us"):
        fused = m1["w13_swiglu"]["cuda_best_us"] + m1["w2_reduce"]["cuda_best_us"]
        lines.append(f"Fused forms at M = 1 (w13:swiglu + w2:reduce, cuda best): {fused:.1f} µs")
    return "\n".join(lines)


def main() -> int:  # noqa: C901
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--render", type=Path)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="after the tests: checks stop being started past 60%% of this, timings past all of it")
    ap.add_argument("--tests-s", type=float, default=80.0, help="the GPU tests' subprocess is stopped past this")
    ap.add_argument("--no-tests", action="store_true")
    a = ap.parse_args()
    if a.plan:
        return plan()
    if a.render:
        print(render(a.render))
        return 0
    if a.out is None:
        ap.error("--out DIR (or --plan, --render JSON) is required")
    a.out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    path = a.out / "cuda_moe.json"
    failed: list[str] = []

    import torch
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
           "command": "python3 bench/cuda_moe_h200.py --out $OUT", "rows": [], "checks": [], "failures": failed}

    def save():
        path.write_text(json.dumps(res, indent=1, default=str))

    if not SMOKE and not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    try:
        import cupy
        res["cupy"] = cupy.__version__
    except ImportError:
        if not SMOKE:
            print("FAIL: CuPy is not installed (the cuda family needs it)")
            return 1
        res["cupy"] = None
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    res["gpu"] = torch.cuda.get_device_name() if not SMOKE else "cpu (smoke: CPU grid port, Triton interpreter)"

    # ---- 1. the GPU tests, in their own process ------------------------------------------------
    if not a.no_tests and not SMOKE:
        res["tests"] = tr = run_tests(a.tests_s)
        print(f"gpu tests ({tr['s']} s): {tr['summary']}", flush=True)
        if tr["rc"] != 0:
            failed.append(f"tests: {tr['summary']}")
            for ln in tr["tail"]:
                if ln.startswith(("FAILED", "ERROR", "E ")):
                    print(f"  {ln[:240]}")
        save()

    t_work = time.time()            # the budget counts from here: the tests have their own limit
    from autotune.core import inputs
    from autotune.core.arch import detect, get_arch
    from autotune.engine import timing
    from autotune.tactics.cuda.family import CudaFamily
    arch = detect() if not SMOKE else get_arch("sm90")
    res["arch"] = arch.name
    fam = CudaFamily()                   # space, verdicts, default
    if SMOKE:                            # builds and packs through the CPU grid port
        from tests.families.cuda_moe_cpu import CudaMoeCpu
        bfam = CudaMoeCpu()
    else:
        bfam = fam
    try:
        from autotune.tactics.triton_fp4 import moe_decode as md
    except Exception as exc:                 # Triton missing: the cuda columns still run
        md = None
        failed.append(f"triton moe_decode unavailable: {one_line(exc)}")
        print(f"FAIL triton moe_decode unavailable: {one_line(exc)}")

    res["copy_Bps"] = rate = copy_rate() if not SMOKE else 1e10
    res["l2_bytes"] = l2 = torch.cuda.get_device_properties(0).L2_cache_size if not SMOKE else 1 << 20
    print(f"copy {rate / 1e12:.2f} TB/s, L2 {l2 / 2**20:.0f} MiB", flush=True)

    # ---- weights ---------------------------------------------------------------------------------
    t0 = time.time()
    plain, packed = {}, {}
    for prob in (W13, W2):
        plain[prob] = [inputs.seeded_weight(prob, DEV, 100 + i) for i in range(POOL)]
        packed[prob] = [bfam.pack("cuda-mma-a-frag-v1", w) for w in plain[prob]]
    sync()
    res["pack_s"] = round(time.time() - t0, 1)
    print(f"weights drawn and packed in {res['pack_s']} s", flush=True)

    def base(prob):
        return W13 if prob.n == W13.n else W2

    # ---- 2. check every candidate, build its launcher --------------------------------------------
    kernels: dict = {}        # (variant, "cuda"|"triton", label) -> (callable(x, w_index, ids, tw, out), tactic)
    gen = torch.Generator(device=DEV).manual_seed(1)

    refs: dict = {}           # (variant, M) -> (x, ids, tw, float64 reference): one per case, shared by candidates

    def case(variant, prob, routed, m):
        if (variant, m) not in refs:
            ids, tw = routing(m, 7 + m, off=True)
            tw = tw if routed else None
            lead = (m, TOP_K) if prob.epilogue == "reduce" else (m,)     # w2 reduce: a row per pair
            x = torch.randn(*lead, prob.k, generator=gen, device=DEV).to(torch.bfloat16)
            refs[(variant, m)] = (x, ids, tw, inputs.moe_reference(prob, x.double(), plain[base(prob)][0], ids, tw))
        return refs[(variant, m)]

    def check(variant, prob, routed, call, wsel):
        worst = 0.0
        for m in MS:
            x, ids, tw, ref = case(variant, prob, routed, m)
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
            call(x, wsel(0), ids, tw, out)
            sync()
            nan = int(torch.isnan(out).sum())
            err = float((out.double() - ref).norm() / ref.norm()) if not nan else float("nan")
            if nan or not err < inputs.TOLERANCE["bf16"]:
                raise RuntimeError(f"M={m}: {nan} NaN/unwritten, rel err {err:.3g}")
            if m > 1 and prob.epilogue != "reduce" and bool(out[m // 2, OFF_SLOT].ne(0).any()):
                raise RuntimeError(f"M={m}: the -1 slot is not a zero row")
            worst = max(worst, err)
        return worst

    for variant, (prob, routed) in VARIANTS.items():
        cands = [("cuda", t) for t in cuda_tactics(variant, prob, arch)]
        cands += [("triton", c) for c in TRITON_CANDS[variant]] if md is not None else []
        if SMOKE:                        # toy shapes: only what their verdicts keep
            cands = [(k, t) for k, t in cands if (cuda_verdict(prob, t, arch) if k == "cuda" else md.verdict(prob, t, arch)).ok]
        for kind, t in cands:
            label = short(t)
            if time.time() - t_work > 0.6 * a.budget_s and not SMOKE:
                failed.append(f"{variant} {kind} {label}: not checked (budget)")
                continue
            try:
                if kind == "cuda":
                    v = cuda_verdict(prob, t, arch)
                    if not v.ok:
                        raise RuntimeError(f"verdict rejects it: {v.reason}")
                    k = bfam.build(prob, Tactic(bfam.name, **t.params), DEV)
                    pk = packed[base(prob)]
                    call = lambda x, w, ids, tw, out, k=k: k(x, w, ids, tw, out=out)  # noqa: E731
                    wsel = lambda i, pk=pk: pk[i % POOL]  # noqa: E731
                else:
                    L = md.make_launcher(prob, t)
                    pl = plain[base(prob)]
                    call = lambda x, w, ids, tw, out, L=L: L(x, w, ids, tw, out=out)  # noqa: E731
                    wsel = lambda i, pl=pl: pl[i % POOL]  # noqa: E731
                worst = check(variant, prob, routed, call, wsel)
                kernels[(variant, kind, label)] = (call, wsel, t)
                res["checks"].append({"variant": variant, "kind": kind, "config": label, "ok": True, "worst": worst})
            except Exception as exc:
                msg = one_line(exc)
                failed.append(f"{variant} {kind} {label}: {msg}")
                res["checks"].append({"variant": variant, "kind": kind, "config": label, "ok": False, "msg": msg,
                                      "trace": traceback.format_exc()[-1500:]})
                print(f"FAIL check {variant} {kind} {label}: {msg}", flush=True)
                if not context_alive():
                    print("FAIL: the CUDA context is lost (a fault in the kernel above); stopping", flush=True)
                    save()
                    return 1
        n_ok = sum(1 for c in res["checks"] if c["variant"] == variant and c["ok"])
        print(f"check {variant}: {n_ok} configs passed at M = {', '.join(map(str, MS))}", flush=True)
    save()

    # ---- MXFP4: the default and two more configs, checked ------------------------------------------
    for pn, prob in (("w13", Problem.moe(W13.n, W13.k, E, TOP_K, "mxfp4")), ("w2", Problem.moe(W2.n, W2.k, E, TOP_K, "mxfp4"))):
        try:
            w = inputs.seeded_weight(prob, DEV, 300)
            pk = bfam.pack("cuda-mma-a-frag-v1", w)
            for t in [t for t in cuda_tactics(pn, prob, arch) if cuda_verdict(prob, t, arch).ok][:3]:
                k = bfam.build(prob, Tactic(bfam.name, **t.params), DEV)
                for m in MX_CHECK_MS:
                    ids, tw = routing(m, 50 + m, off=True)
                    x = torch.randn(m, prob.k, generator=gen, device=DEV).to(torch.bfloat16)
                    ref = inputs.moe_reference(prob, x.double(), w, ids, tw)
                    out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
                    k(x, pk, ids, tw, out=out)
                    sync()
                    err = float((out.double() - ref).norm() / ref.norm())
                    ok = not torch.isnan(out).any() and err < inputs.TOLERANCE["bf16"]
                    res["checks"].append({"variant": f"{pn}_mxfp4", "kind": "cuda", "config": short(t), "m": m,
                                          "ok": bool(ok), "err": err})
                    if not ok:
                        failed.append(f"{pn} mxfp4 {short(t)} M={m}: rel err {err:.3g}")
                        print(f"FAIL check {pn} mxfp4 {short(t)} M={m}: rel err {err:.3g}", flush=True)
            del w, pk
        except Exception as exc:
            failed.append(f"{pn} mxfp4: {one_line(exc)}")
            print(f"FAIL check {pn} mxfp4: {one_line(exc)}", flush=True)
            if not context_alive():
                print("FAIL: the CUDA context is lost; stopping", flush=True)
                save()
                return 1
    print(f"check mxfp4: {sum(1 for c in res['checks'] if 'mxfp4' in c['variant'] and c['ok'])} runs passed", flush=True)
    save()

    # ---- 3. timings --------------------------------------------------------------------------------
    quick = timing.TimerConfig(min_reps=5, max_reps=20, budget_s=0.03)
    for m in MS:
        for variant, (prob, routed) in VARIANTS.items():
            if time.time() - t_work > a.budget_s and not SMOKE:
                failed.append(f"{variant} M={m}: not timed (budget)")
                print(f"FAIL {variant} M={m}: not timed (over the {a.budget_s:.0f} s budget)", flush=True)
                continue
            bp = base(prob)
            ebytes = bp.n * (bp.k // 2 + bp.k // bp.block) + 4
            routes = [routing(m, 1000 * m + 17 * i, off=False) for i in range(MAX_SETS)]
            touched = statistics.mean(len(set(r[0].reshape(-1).tolist())) for r in routes)
            reduce = prob.epilogue == "reduce"
            n_out = m * prob.n if reduce else m * TOP_K * prob.out_n
            x_rows = m * TOP_K if reduce else m
            floor_b = touched * ebytes + x_rows * prob.k * 2 + n_out * 2 + m * TOP_K * 8
            n_sets = max(2, min(MAX_SETS, math.ceil(2 * l2 / max(1.0, touched * ebytes))))
            lead = (m, TOP_K) if reduce else (m,)
            xs = [torch.randn(*lead, prob.k, generator=gen, device=DEV).to(torch.bfloat16) for _ in range(n_sets)]
            oshape = (m, prob.n) if reduce else (m, TOP_K, prob.out_n)
            outs = [torch.empty(oshape, dtype=torch.bfloat16, device=DEV) for _ in range(n_sets)]
            row = {"variant": variant, "m": m, "sets": n_sets, "touched": touched, "floor_bytes": floor_b,
                   "floor_us": floor_b / rate * 1e6, "cuda": {}, "triton": {}}
            for (vname, kind, label), (call, wsel, t) in kernels.items():
                if vname != variant:
                    continue
                try:
                    def one(i, call=call, wsel=wsel):
                        ids, tw = routes[i]
                        return call(xs[i], wsel(i), ids, tw if routed else None, outs[i])
                    row[kind][label] = timing.time_calls(one, n_sets, DEV, quick).median_us
                except Exception as exc:
                    failed.append(f"{variant} M={m} {kind} {label}: {one_line(exc)}")
                    print(f"FAIL time {variant} M={m} {kind} {label}: {one_line(exc)}", flush=True)
                    if not context_alive():
                        print("FAIL: the CUDA context is lost; stopping", flush=True)
                        res["rows"].append(row)
                        save()
                        return 1
            for kind in ("cuda", "triton"):
                if row[kind]:
                    lab, us = min(row[kind].items(), key=lambda kv: kv[1])
                    row[f"{kind}_best"], row[f"{kind}_best_us"] = lab, us
            row["cuda_default_us"] = row["cuda"].get(short(fam.default(prob, arch)))
            res["rows"].append(row)
            print(f"{variant:11s} M={m:3d} cuda {row.get('cuda_best_us', float('nan')):7.1f} us "
                  f"({row.get('cuda_best', '-')}) triton {row.get('triton_best_us', float('nan')):7.1f} us "
                  f"({row.get('triton_best', '-')}) floor {row['floor_us']:6.1f} us", flush=True)
            save()
    res["elapsed_s"] = round(time.time() - t_start, 1)
    save()
    print()
    print(render(path))
    print(f"\n{len(failed)} failures; {res['elapsed_s']} s; JSON {path}")
    for f in failed:
        print(f"  FAIL {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
