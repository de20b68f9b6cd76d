"""Ahead-of-time compilation under a timeout: the search's precompile stage.

Kept tactics of families that compile (Triton, cuda) are compiled before timing in `n` worker
processes (`python -m autotune.engine.precompile`, one JSON line per request, like the measuring
worker). Each request has `timeout_s` (the search's --timeout-s): past it the worker is killed
(SIGKILL) and the tactic fails with that stage and signal; a worker that dies (a segfault in a
compiler) fails only the tactic it was compiling. Either way a fresh worker takes the next item
and the search goes on. In-process only with isolate=False (--no-isolate, debugging): no timeout
there, as for every other stage.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from autotune.core.arch import get_arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine.executor import WorkerStartError
from autotune.tactics import registry

#: a new compile worker imports torch and the families first
START_TIMEOUT_S = 180.0

Result = tuple  # (error or None, compiled smem bytes or None, exit signal or None)


def compile_one(problem_key: str, tactic_json: str, arch_name: str, families: dict) -> tuple[str | None, int | None]:
    """(error or None, compiled smem or None) of one tactic's precompile, in this process."""
    from autotune.engine.worker import error_text
    for name, path in families.items():
        registry.FAMILIES.setdefault(name, path)
    t = Tactic.from_json(tactic_json)
    try:
        smem = registry.get(t.family).precompile(Problem.from_key(problem_key), t, get_arch(arch_name))
        return None, smem
    except Exception as e:
        return error_text(e), None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class _Worker:
    def __init__(self, families: dict, log):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.p = subprocess.Popen([sys.executable, "-m", "autotune.engine.precompile"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1)
        self._send({"families": families})
        self.ready = False
        self.item: tuple[int, float] | None = None        # (index, deadline) of the request in flight

    def _send(self, msg: dict) -> None:
        try:
            self.p.stdin.write(json.dumps(msg) + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass    # the death shows up as EOF on stdout

    def request(self, i: int, problem_key: str, tactic_json: str, arch_name: str, timeout_s: float) -> None:
        self._send({"problem": problem_key, "tactic": tactic_json, "arch": arch_name})
        self.item = (i, time.monotonic() + timeout_s)

    def died(self, what: str) -> Result:
        rc = self.p.wait()
        if rc < 0:
            return f"compile worker died with {signal_name(-rc)} while {what}", None, -rc
        return f"compile worker exited with status {rc} while {what}", None, None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()

    def close(self) -> None:
        try:
            self.p.stdin.close()
            self.p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        try:
            self.p.stdout.close()
        except OSError:
            pass


def compile_all(items: list[tuple[str, str]], arch_name: str, n_jobs: int, families: dict, *,
                timeout_s: float, isolate: bool = True) -> list[Result]:
    """Compile (problem key, tactic json) pairs for an arch in n_jobs worker processes, each
    request under timeout_s. Returns (error or None, smem or None, exit signal or None) per item,
    in order. Raises WorkerStartError when a worker cannot start at all."""
    if not items:
        return []
    if not isolate:
        return [(*compile_one(pk, tj, arch_name, families), None) for pk, tj in items]
    results: list[Result | None] = [None] * len(items)
    queue = deque(range(len(items)))
    log = tempfile.NamedTemporaryFile(prefix="autotune-compile-", suffix=".log", delete=False)
    workers: list[_Worker] = []
    try:
        workers = [_Worker(families, log) for _ in range(min(n_jobs, len(items)))]
        while queue or any(w.item for w in workers):
            for k, w in enumerate(workers):
                if w.p.poll() is not None and w.item is None:      # killed or died earlier: a fresh one
                    w.close()
                    w = workers[k] = _Worker(families, log)
                if w.ready and w.item is None and queue:
                    i = queue.popleft()
                    w.request(i, *items[i], arch_name, timeout_s)
            _wait(workers, items, results, timeout_s, log.name)
    finally:
        for w in workers:
            w.close()
        log.close()
        try:
            os.unlink(log.name)
        except OSError:
            pass
    return results  # type: ignore[return-value]


def _what(items, i: int) -> str:
    pk, tj = items[i]
    return f"precompiling {Tactic.from_json(tj)} for {pk}"


def _wait(workers: list[_Worker], items, results: list, timeout_s: float, log_name: str) -> None:
    """One round: wait for a reply, a start, a death or the nearest deadline, and settle it."""
    now = time.monotonic()
    deadlines = [w.item[1] for w in workers if w.item] or [now + START_TIMEOUT_S]
    sel = selectors.DefaultSelector()
    for w in workers:
        sel.register(w.p.stdout, selectors.EVENT_READ, w)
    ready = sel.select(max(0.0, min(deadlines) - now))
    sel.close()
    for key, _ in ready:
        w = key.data           # the _Worker registered with its stdout
        line = w.p.stdout.readline()
        if not w.ready:
            if not line:
                raise WorkerStartError(f"a compile worker could not start: {w.died('starting')[0]}"
                                       + _tail(log_name))
            w.ready = True
            continue
        if w.item is None:
            continue
        i = w.item[0]
        w.item = None
        if not line:
            results[i] = w.died(_what(items, i))
            continue
        reply = json.loads(line)
        results[i] = (reply.get("err"), reply.get("smem"), None)
    now = time.monotonic()
    if not ready and not any(w.item for w in workers) and not all(w.ready for w in workers):
        raise WorkerStartError(f"a compile worker did not start within {START_TIMEOUT_S:g} s" + _tail(log_name))
    for w in workers:
        if w.item is not None and now >= w.item[1]:
            i = w.item[0]
            w.kill()
            w.item = None
            results[i] = (f"timed out after {timeout_s:g} s while {_what(items, i)}; compile worker killed",
                          None, int(signal.SIGKILL))


def _tail(log_name: str) -> str:
    try:
        lines = Path(log_name).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f" ({lines[-1][:200]})" if lines else ""


def main() -> int:
    # the protocol owns the real stdout; whatever a compiler prints goes to stderr (the log)
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    hello = json.loads(sys.stdin.readline() or "{}")
    families = hello.get("families", {})
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        err, smem = compile_one(msg["problem"], msg["tactic"], msg["arch"], families)
        proto.write(json.dumps({"err": err, "smem": smem}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
