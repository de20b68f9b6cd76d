"""Record in tactics/cuda/gpu_checked.json that the cuda kernels' current texts passed their GPU tests.

    python3 tools/mark_gpu_checked.py LOG [--log-name NAME] [--kernel moe_mma ...] [--record PATH] [--gpu NAME]

LOG is the pytest output of the GPU tests (bench/device_run.sh GPU_TESTS=1 keeps it as
gpu-tests-full.txt, run with -rA). It qualifies only when its summary line says tests passed and none
failed, errored or xpassed, no test of the cuda GPU files was skipped (a skipped GPU test, e.g.
without CuPy, checked nothing; a skip elsewhere must be named by -rA), and each kernel recorded has
PASSED lines of its own tests (KERNEL_TESTS). Each named kernel (default:
every cuda kernel) is then recorded with its code's digest (tactics/cuda/checked.py), the log's name
(--log-name: the name it is committed under in docs/data/) and count, the date and the GPU; the file
is replaced atomically. Exit 1 with one line otherwise.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from autotune.tactics.cuda import members as M  # noqa: E402

#: the GPU tests of the cuda kernels (the members' and the ones they share, members.gpu_tests): a
#: skip in one of these checked nothing
CUDA_GPU_TESTS = (*(Path(f).name for f in M.gpu_tests()), "test_nosync_gpu.py")
#: per kernel, the tests (file, name prefix, whether the prefix is required or excluded) that must have
#: passed: each member's own (members.REGISTRY)
KERNEL_TESTS = M.kernel_tests()


def evidence(log: str, kernel: str) -> int:
    """How many of `kernel`'s own GPU tests the log shows PASSED (pytest -rA prints one line each)."""
    fname, prefix, want = KERNEL_TESTS[kernel]
    n = 0
    for path, name in re.findall(r"^PASSED (\S+?)::(\w+)", log, re.M):
        n += Path(path).name == fname and name.startswith(prefix) == want
    return n


def passed(log: str) -> int:
    """Tests passed by the log's last pytest summary line; ValueError unless none failed, errored or
    xpassed and none was skipped in the cuda GPU test files (a skip elsewhere is allowed only where
    the log names its file: pytest -rA (or -rs) prints `SKIPPED [n] path:line: reason`)."""
    lines = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed|error|errors|skipped)\b", ln)]
    if not lines:
        raise ValueError("no pytest summary line in the log (cut before it ended?)")
    last = lines[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b", last)}
    bad = {k: v for k, v in counts.items() if k not in ("passed", "skipped") and v}
    if bad or not counts.get("passed"):
        raise ValueError(f"the GPU tests did not all pass: {last.strip()}")
    if counts.get("skipped"):
        where = re.findall(r"^SKIPPED \[(\d+)\] ([^:\s]+)", log, re.M)
        named = sum(int(n) for n, _ in where)
        cuda = sorted({f for _, f in where if Path(f).name in CUDA_GPU_TESTS})
        if named < counts["skipped"] or cuda:
            raise ValueError(f"skipped GPU tests checked nothing: {', '.join(cuda) or 'files not named (run pytest -rA)'}"
                             f" ({last.strip()})")
    return counts["passed"]


def main(argv=None) -> int:
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import checked as C
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--kernel", action="append", choices=sorted(B.SOURCES), help="default: every cuda kernel")
    ap.add_argument("--log-name", help="the log's name under docs/data/ (default: LOG's file name)")
    ap.add_argument("--record", type=Path, default=C.RECORD)
    ap.add_argument("--gpu", default=None, help="default: torch's name of device 0")
    a = ap.parse_args(argv)
    try:
        n = passed(a.log.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        print(f"mark_gpu_checked: {a.log}: {e}", file=sys.stderr)
        return 1
    gpu = a.gpu
    if gpu is None:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "unknown"
    kernels = a.kernel or sorted(B.SOURCES)
    log = a.log.read_text(errors="replace")
    missing = [k for k in kernels if not evidence(log, k)]
    if missing:                                       # a log without a kernel's own tests checked nothing of it
        print(f"mark_gpu_checked: {a.log}: no PASSED line of {', '.join(missing)}'s GPU tests "
              "(run them with pytest -rA)", file=sys.stderr)
        return 1
    rec = dict(C.record(a.record))
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    for k in kernels:
        rec[k] = {"digest": C.digest(k), "log": a.log_name or a.log.name, "passed": n, "date": date, "gpu": gpu}
    tmp = a.record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, a.record)
    print(f"mark_gpu_checked: {', '.join(kernels)} recorded ({n} passed, {gpu})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
