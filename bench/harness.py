"""What every bench script shares: the common arguments, the device record, timing through
autotune.engine.timing, and the output a measurement entry cites (a JSON file and a Markdown table).

    python3 bench/harness.py --smoke [--json out.json]      # the harness's own CPU check (CI runs it)

A script builds its parser with `parser(__doc__)` (its `--help` prints the docstring and creates
nothing), adds `common(ap)` for `--json`, `--table` and `--smoke`, times with `time_us` /
`time_host_ns`, and ends with `write(args, result, rows)`: the JSON holds the result, its rows,
the command and `record()` under "machine" (card, driver, library versions, commit, date), so a
measurement entry (docs/measurements/) names one file for its numbers and where they came from. `--smoke` (or
BENCH_SMOKE=1) asks a script for its smallest run: what tests/test_bench_smoke.py runs on the CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the libraries whose versions a record names (those not installed are left out)
LIBS = ("torch", "triton", "cupy", "sqlalchemy", "nvmath", "lightgbm")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the module docstring as its help: first line as description, the rest after."""
    head, _, rest = (doc or "").strip().partition("\n")
    return argparse.ArgumentParser(description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def common(ap: argparse.ArgumentParser, json_default: str | None = None) -> argparse.ArgumentParser:
    """The arguments every measuring script takes: where its JSON and table go, and the smoke mode."""
    ap.add_argument("--json", default=json_default, help="write the result, its rows and the device record here")
    ap.add_argument("--table", default=None, help="write the rows as a Markdown table here (default: print it)")
    ap.add_argument("--smoke", action="store_true", default=smoke(),
                    help="the smallest run (CPU, tiny sizes): what CI runs (also BENCH_SMOKE=1)")
    return ap


def smoke() -> bool:
    return os.environ.get("BENCH_SMOKE", "") not in ("", "0")


def existing(path: str) -> str:
    """argparse type: a file that exists (never created by opening it)."""
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    return path


def is_sync_warning(w) -> bool:
    """A warning of torch's sync debug mode for one device sync (not its one-time "prototype"
    notice, which also says "synchronizing")."""
    msg = str(w.message)
    return "synchroniz" in msg and "prototype" not in msg


# -- the device record --------------------------------------------------------------------------

def _run(cmd: Sequence[str]) -> str | None:
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def commit() -> str | None:
    """This tree's short commit, `+dirty` when tracked files differ from it (None outside git)."""
    rev = _run(["git", "rev-parse", "--short", "HEAD"])
    if rev is None:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True).returncode
    return rev + ("+dirty" if dirty else "")


def versions() -> dict[str, str]:
    from importlib import metadata
    out = {"python": platform.python_version()}
    for lib in LIBS:
        try:
            out[lib] = metadata.version({"cupy": "cupy-cuda13x"}.get(lib, lib))
        except metadata.PackageNotFoundError:
            try:
                out[lib] = __import__(lib).__version__
            except Exception:     # noqa: BLE001  (not installed, or no version: left out)
                pass
    return out


def record(device: str = "auto") -> dict[str, Any]:
    """Where a measurement ran: card (or the CPU), driver, CUDA runtime, library versions, commit, date."""
    import torch
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    rec: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
                           "host": platform.node(), "cpus": os.cpu_count(), "versions": versions()}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        rec |= {"card": p.name, "cc": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                "memory_GiB": round(p.total_memory / 2**30, 1), "cuda_runtime": torch.version.cuda,
                "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])}
    else:
        rec |= {"card": "cpu", "cpu": platform.processor() or platform.machine(), "driver": None}
    return rec


# -- timing ---------------------------------------------------------------------------------------

def time_us(call: Callable[[int], object], n_sets: int = 1, device: str = "cpu", reps: int = 20,
            warmup: int = 1, budget_s: float = math.inf, eager: bool = False) -> dict[str, float]:
    """call(i) (i: the input set) timed by autotune.engine.timing (CUDA-graph replays or events on
    the GPU, perf_counter on the CPU): median and IQR in µs and the repetitions. eager: CUDA events
    around each call as it is (no warm-up, no capture: e.g. the replay of a graph the caller made)."""
    from autotune.engine import timing
    cfg = timing.TimerConfig(warmup=warmup, min_reps=reps, max_reps=reps, budget_s=budget_s)
    t = timing.time_calls(call, n_sets, device, cfg, memo={"eager": True} if eager else None)
    return {"median_us": t.median_us, "iqr_us": t.iqr_us, "reps": t.reps}


def time_host_ns(loop: Callable[[int], object], calls: int, reps: int) -> dict[str, float]:
    """Host ns per call of loop(r), which makes `calls` calls (r: the repetition): each repetition
    one sample of autotune.engine.timing on the CPU; p50, p90 and min per call over the `reps`."""
    per = sorted(time_us(lambda i, r=r: loop(r), device="cpu", reps=1, warmup=0)["median_us"] * 1e3 / calls
                 for r in range(reps))
    return {"p50_ns": statistics.median(per), "p90_ns": per[int(0.9 * (len(per) - 1))], "min_ns": per[0], "reps": reps}


def copy_rate(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy, read + written (a 1 GiB copy timed by time_us):
    the rate a byte floor divides by."""
    import torch
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = time_us(lambda i: b.copy_(a), device=device, reps=20, warmup=3)
    return 2 * nbytes / (t["median_us"] * 1e-6)


def profile_kernels(run: Callable[[], object], n: int, top: int = 25) -> list[dict]:
    """Per kernel name: launches and µs per run() over n runs (torch profiler, CUDA activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run()
        torch.cuda.synchronize()
    agg: dict[str, list] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            a = agg.setdefault(e.name, [0, 0.0])
            a[0] += 1
            a[1] += e.time_range.end - e.time_range.start       # a kernel record: its own span, µs
    rows = [{"kernel": k[:120], "launches": c / n, "us": us / n} for k, (c, us) in agg.items()]
    return sorted(rows, key=lambda r: -r["us"])[:top]


def capture_graph(fn: Callable[[], object]):
    """fn captured as one CUDA graph (run once on the capture stream first, so its allocations are made)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


# -- output ---------------------------------------------------------------------------------------

def table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """The rows as a Markdown table (columns: the first row's keys unless given); floats to 3 digits."""
    if not rows:
        return "(no rows)\n"
    cols = list(columns or rows[0].keys())
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(args: argparse.Namespace, result: dict, rows: Sequence[dict] = (), columns: Sequence[str] | None = None,
          device: str = "auto") -> dict:
    """The output a measurement entry cites: `result` (with `rows` when given), the command and the
    device record (key "machine") as JSON at --json (when given; written whole, never half); the rows
    as a Markdown table at --table, else printed."""
    doc = {"command": " ".join(shlex.quote(a) for a in ["python3", *sys.argv]), **result, "machine": record(device)}
    if rows:
        doc["rows"] = list(rows)
    if getattr(args, "json", None):
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        tmp.replace(path)
    if rows:
        text = table(rows, columns)
        if getattr(args, "table", None):
            Path(args.table).write_text(text)
        else:
            print(text, end="")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """The harness's smoke run: a small CPU matmul timed through engine.timing, with its record."""
    ap = common(parser(__doc__))
    a = ap.parse_args(argv)
    if not a.smoke:
        ap.error("the harness alone runs only its smoke check: --smoke (or BENCH_SMOKE=1)")
    import torch
    sizes = (16, 64)
    rows = []
    for n in sizes:
        xs = [torch.randn(n, n) for _ in range(2)]
        t = time_us(lambda i: xs[i] @ xs[i], n_sets=2, device="cpu", reps=5)
        rows.append({"n": n, **t})
    write(a, {"what": "harness smoke: CPU matmul timed through autotune.engine.timing"}, rows, device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
