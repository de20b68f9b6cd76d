"""Per-call cost of choosing a kernel: fp4-autotune's dispatch vs FlashInfer's AutoTuner lookup.

Both sides get a warm table for one dense NVFP4 GEMM problem tuned at FlashInfer's hybrid buckets
up to 8192 (21 buckets), and the same stream of random M in [1, 8192].

  ours      a real cache file (SQLite) with one winner per bucket, loaded by autotune.Dispatcher;
            rungs: Table(m) (an engine that bound its table at load), dispatcher((M, N, K)),
            dispatcher(problem, M), a problem with no winners (default rung), a pinned problem.
  flashinfer  the installed FlashInfer's `AutoTuner.choose_one` in serving (non-tuning) mode with
            mm_fp4's own TuningConfig (`_MM_FP4_TUNING_CONFIG_128x4`) and its 10-input signature on
            meta tensors; three runners like mm_fp4 with three backends; the in-memory winner cache
            filled for every bucket through `AutoTuner._get_cache_key`, exactly the key its lookup
            computes. A miss uses an N with no entries (FlashInfer returns runner 0, tactic -1).

Timing: bench/harness.py (autotune.engine.timing on the CPU) around batches of --batch calls; the
per-call figure of a batch is its
mean; the table reports p50 / p90 over --reps batches. The loop itself is included (its cost alone
is the "empty loop" row). Needs `pip install flashinfer-python` (imports without a GPU) for the
FlashInfer rows; without it they are reported as not run.

    python3 bench/dispatch_latency.py [--reps 200] [--batch 1000] [--json out.json]
"""
from __future__ import annotations

import platform
import random
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402

N, K = 6144, 4096          # a GLM-5-sized dense projection
MAX_TOKENS = 8192


def _timeit(fn_loop, ms: list[int], reps: int, batch: int) -> dict:
    """fn_loop(ms_slice) runs the calls; returns ns per call (p50, p90, min) over batches (harness timing)."""
    n = len(ms)
    start = lambda r: (r * batch) % (n - batch)    # noqa: E731
    t = harness.time_host_ns(lambda r: fn_loop(ms[start(r):start(r) + batch]), batch, reps)
    return {k: t[k] for k in ("p50_ns", "p90_ns", "min_ns")}


# ------------------------------------------------------------------------------------------ ours

def _our_cache(path: Path, buckets: tuple[int, ...]):
    """A cache with one torch-family winner per bucket for the CPU environment (varying tactics,
    so the table holds distinct kernels), written through the normal Store API."""
    from autotune.core.env import cpu
    from autotune.core.problem import Problem
    from autotune.core.records import Winner
    from autotune.cache import Store
    from autotune.tactics import registry
    from autotune.tactics.torch_ref import CHUNKS, DTYPES

    env = cpu()
    fam = registry.get("torch")
    p = Problem.dense(N, K)
    tactics = [registry.get("torch").enumerate(p, None)[i] for i in range(len(DTYPES) * len(CHUNKS))]
    with Store(path) as s:
        s.put_environment(env, fam.depends_on)
        for i, b in enumerate(buckets):
            t = tactics[i % len(tactics)]
            lib = env.lib_key(fam.depends_on)          # the code key: served only by the code it names
            s.put_winner(Winner(p.key, b, env.device_key, t.id, t.family, t.to_json(), lib,
                                10.0 + i, tactics[0].id, 11.0 + i, (11.0 + i) / (10.0 + i), registry.code_key(t, lib)))
    return env, p


def bench_ours(ms: list[int], reps: int, batch: int, buckets: tuple[int, ...]) -> dict:
    from autotune.runtime.dispatch import Dispatcher
    from autotune.core.problem import Problem
    from autotune.core.tactic import Tactic

    with tempfile.TemporaryDirectory() as d:
        env, p = _our_cache(Path(d) / "cache.db", buckets)
        disp = Dispatcher(Path(d) / "cache.db", env=env, record_misses=False, warn=False)
    assert not disp.skipped, disp.skipped
    table = disp.table(p)
    assert table.buckets == buckets
    unknown = Problem.dense(N + 128, K)
    disp.table(unknown).default.resolve()          # build the default once, as a warm server would
    pinned = Problem.dense(N + 256, K)
    disp.pin(pinned, Tactic("torch", dequant_dtype="fp32", chunk_n=0))
    ptable = disp.table(pinned)
    out = {}

    def loop_empty(chunk):
        for m in chunk:
            pass

    def loop_table(chunk, t=table):
        for m in chunk:
            t(m)

    def loop_index(chunk, t=table):
        for m in chunk:
            t.index(m)

    def loop_shape(chunk, d=disp):
        for m in chunk:
            d((m, N, K))

    def loop_problem(chunk, d=disp, p=p):
        for m in chunk:
            d(p, m)

    def loop_default(chunk, t=disp.table(unknown)):
        for m in chunk:
            t(m)

    def loop_pinned(chunk, t=ptable):
        for m in chunk:
            t(m)

    for name, fn in (("empty loop", loop_empty), ("ours: Table(m) [exact/nearest]", loop_table),
                     ("ours: Table.index(m) -> bucket slot (bound launchers)", loop_index),
                     ("ours: dispatcher((M, N, K))", loop_shape), ("ours: dispatcher(problem, M)", loop_problem),
                     ("ours: default rung (miss)", loop_default), ("ours: pinned rung", loop_pinned)):
        fn(ms[:batch])       # warm
        out[name] = _timeit(fn, ms, reps, batch)
    out["_rungs"] = dict(disp.stats)
    return out


# ------------------------------------------------------------------------------------ flashinfer

def bench_flashinfer(ms: list[int], reps: int, batch: int) -> dict:
    import logging

    import torch
    from flashinfer.autotuner import AutoTuner, TunableRunner
    from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets
    from flashinfer.gemm.gemm_base import _MM_FP4_TUNING_CONFIG_128x4 as config
    import flashinfer

    from flashinfer.jit.core import logger as fi_logger
    logging.getLogger("flashinfer").setLevel(logging.ERROR)
    fi_logger.setLevel(logging.ERROR)          # its once-per-shape "no tuned config" warning on misses

    class _Runner(TunableRunner):   # stands in for mm_fp4's cudnn / cutlass / trtllm runners
        def get_valid_tactics(self, inputs, profile):
            return list(range(32))

        def forward(self, inputs, tactic=-1, do_preparation=False, **kw):
            return inputs[6]

    class Cudnn(_Runner):
        pass

    class Cutlass(_Runner):
        pass

    class Trtllm(_Runner):
        pass

    runners = [Cudnn(), Cutlass(), Trtllm()]
    meta = torch.device("meta")

    def inputs(m: int, n: int = N):
        a = torch.empty(m, K // 2, dtype=torch.uint8, device=meta)
        b = torch.empty(n, K // 2, dtype=torch.uint8, device=meta)
        a_sf = torch.empty(m * K // 16, dtype=torch.uint8, device=meta)
        b_sf = torch.empty(n * K // 16, dtype=torch.uint8, device=meta)
        alpha = torch.empty(1, dtype=torch.float32, device=meta)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=meta)
        ws = torch.empty(32 << 20, dtype=torch.uint8, device=meta)
        return [a, b, a_sf, b_sf, alpha, torch.bfloat16, out, 16, True, ws]

    tuner = AutoTuner.get()
    tuner.is_tuning_mode = False
    fi_buckets = tuple(get_hybrid_num_tokens_buckets(MAX_TOKENS))
    winners = tuner._winner_cache()
    for i, b in enumerate(fi_buckets):         # a winner in runner 1 (cutlass) for every bucket
        x = inputs(b)
        shapes = tuple(tuner._get_input_sizes(x))
        key = AutoTuner._get_cache_key("fp4_gemm", runners[1], shapes, config, runners[1].get_cache_key_extras(x))
        winners[key] = (i % 32, None)
    pool = {m: inputs(m) for m in set(ms)}
    miss_pool = {m: inputs(m, N + 128) for m in set(ms[:4 * batch])}
    r, t = tuner.choose_one("fp4_gemm", runners, config, pool[ms[0]])
    assert r is runners[1] and t != -1, (r, t)   # really a hit

    def loop_hit(chunk, choose=tuner.choose_one, pool=pool):
        for m in chunk:
            choose("fp4_gemm", runners, config, pool[m])

    def loop_miss(chunk, choose=tuner.choose_one, pool=miss_pool):
        for m in chunk:
            choose("fp4_gemm", runners, config, pool[m])

    def loop_pool(chunk, pool=pool):       # the dict lookup that fetches the prepared inputs
        for m in chunk:
            pool[m]

    out = {"_version": flashinfer.__version__, "_buckets": len(fi_buckets)}
    for name, fn, src in (("flashinfer: input fetch only", loop_pool, ms),
                          ("flashinfer: choose_one hit", loop_hit, ms),
                          ("flashinfer: choose_one miss", loop_miss, ms[:4 * batch])):
        fn(src[:batch])
        out[name] = _timeit(fn, src, max(10, reps // (4 if "miss" in name else 1)), batch)
    r, t = tuner.choose_one("fp4_gemm", runners, config, miss_pool[ms[0]])
    assert t == -1
    return out


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=20000, help="length of the random M stream")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from autotune.core.buckets import hybrid
    rng = random.Random(a.seed)
    ms = [rng.randint(1, MAX_TOKENS) for _ in range(max(a.calls, 2 * a.batch))]
    buckets = hybrid(MAX_TOKENS)
    warnings.simplefilter("ignore")
    rows = bench_ours(ms, a.reps, a.batch, buckets)
    try:
        rows.update(bench_flashinfer(ms, a.reps, a.batch))
    except ImportError as e:
        rows["flashinfer: not run"] = {"why": f"flashinfer not importable: {e}"}
    import torch
    head = (f"python {platform.python_version()}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
            f"{len(buckets)} buckets, {len(ms)} random M in [1, {MAX_TOKENS}], N={N} K={K}, "
            f"{a.reps} batches x {a.batch} calls"
            + (f", flashinfer {rows['_version']}" if "_version" in rows else ""))
    print(head)
    print(f"| {'path':40} | p50 µs/call | p90 µs/call |")
    print(f"|{'-' * 42}|------------:|------------:|")
    for name, r in rows.items():
        if name.startswith("_"):
            continue
        if "p50_ns" not in r:
            print(f"| {name:40} | {r.get('why', '')} | |")
            continue
        print(f"| {name:40} | {r['p50_ns'] / 1000:11.3f} | {r['p90_ns'] / 1000:11.3f} |")
    print(f"rungs counted (ours): {rows['_rungs']}")
    if a.json:
        harness.write(a, {"header": head, "rows": rows})


if __name__ == "__main__":
    main()
