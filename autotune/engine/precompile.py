"""Ahead-of-time compilation under a timeout: the search's compile pool.

Kept tactics of families that compile (Triton, cuda) are compiled in up to `n` worker processes
(`python -m autotune.engine.precompile`, one JSON line per request, like the measuring worker),
each a warm process serving request after request. `Pool` is a priority queue in front of them:
items are submitted with a priority, `wait(keys)` raises the ones asked for to the front and
blocks until each is compiled or failed, and a background thread feeds the workers, so the search
can measure while later items still compile (autotune.engine.pipeline). Each request has
`timeout_s` (the search's --timeout-s): past it the worker is killed (SIGKILL) and the item fails
with that stage and signal; a worker that dies (a segfault in a compiler) fails only the item it
was compiling. Either way a fresh worker takes the next item. Workers start only while items wait
for one (at most `n`), at a lower CPU priority (`NICE`) than the measuring worker. `compile_all`
is the pool used as a barrier (the audit, --compile-check); in-process only with isolate=False
(--no-isolate, debugging): no timeout there, as for every other stage.
"""
from __future__ import annotations

import heapq
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Hashable, Iterable

from autotune.core.arch import get_arch
from autotune.core.layer import parse_key
from autotune.core.tactic import Tactic
from autotune.engine import deadline
from autotune.engine.executor import WorkerStartError, exit_now
from autotune.tactics import registry

#: a new compile worker imports torch and the families first
START_TIMEOUT_S = 180.0
#: compile workers run this much nicer than the search and its measuring workers: while they
#: compile in the background, the measuring side keeps the CPU it needs
NICE = 10

Result = tuple  # (error or None, compiled smem bytes or None, exit signal or None)


def compile_one(problem_key: str, tactic_json: str, arch_name: str, families: dict) -> tuple[str | None, int | None]:
    """(error or None, compiled smem or None) of one tactic's precompile, in this process."""
    from autotune.engine.worker import error_text
    for name, path in families.items():
        registry.FAMILIES.setdefault(name, path)
    t = Tactic.from_json(tactic_json)
    try:
        smem = registry.get(t.family).precompile(parse_key(problem_key), t, get_arch(arch_name))
        return None, smem
    except Exception as e:
        return error_text(e), None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class _Worker:
    def __init__(self, families: dict, log, preload: Iterable[str] = ()):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.p = subprocess.Popen([sys.executable, "-m", "autotune.engine.precompile"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1)
        try:
            os.setpriority(os.PRIO_PROCESS, self.p.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE))
        except OSError:
            pass        # gone already (the death shows up as EOF), or not allowed: it runs at ours
        self._send({"families": families, "preload": sorted(preload)})
        self.ready = False
        self.dead = False
        self.started = time.monotonic()
        self.item: tuple[Hashable, deadline.Deadline] | None = None    # (key, deadline) of the request in flight

    def _send(self, msg: dict) -> None:
        try:
            self.p.stdin.write(json.dumps(msg) + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass    # the death shows up as EOF on stdout

    def request(self, key: Hashable, problem_key: str, tactic_json: str, arch_name: str, timeout_s: float) -> None:
        self._send({"problem": problem_key, "tactic": tactic_json, "arch": arch_name})
        self.item = (key, deadline.make(timeout_s, tactic_json))

    def died(self, what: str) -> Result:
        self.dead = True
        rc = self.p.wait()
        if rc < 0:
            return f"compile worker died with {signal_name(-rc)} while {what}", None, -rc
        return f"compile worker exited with status {rc} while {what}", None, None

    def kill(self) -> None:
        self.dead = True
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()

    def hang_up(self) -> None:
        """Idle: end its input, so it exits; busy (a cancelled background compile): kill it."""
        try:
            if self.item is not None:
                raise OSError
            self.p.stdin.close()
        except OSError:
            self.kill()

    def close(self) -> None:
        """Wait for it to exit after `hang_up` (kill it past 10 s)."""
        self.hang_up()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass


class PoolClosed(RuntimeError):
    """The pool was closed (the search ended or was interrupted) while something waited on it."""


class Pool:
    """Up to `n` compile workers serving a priority queue (smallest priority first, then the order
    of submission). Thread-safe: the search's threads submit and wait, one thread of its own
    feeds the workers. Figures: `overlapped_s`, wall seconds the pool had work while nobody
    waited on it (compilation off the critical path); `settled` items compiled or failed."""

    def __init__(self, arch_name: str, n: int, families: dict, *, timeout_s: float,
                 preload: Iterable[str] = ()):
        self.arch_name, self.n, self.families, self.timeout_s = arch_name, max(1, n), dict(families), timeout_s
        self.preload = tuple(preload)
        self._cv = threading.Condition()
        self._heap: list = []                       # (priority, seq, key); stale entries skipped
        self._queued: dict[Hashable, tuple] = {}    # key -> its best priority, while queued
        self._items: dict[Hashable, tuple[str, str]] = {}
        self._results: dict[Hashable, Result] = {}
        self._new: list[Hashable] = []              # settled, not drained yet
        self._workers: list[_Worker] = []
        self._seq = itertools.count()
        self.error: BaseException | None = None
        self.closed = False
        self.waiters = 0
        self.overlapped_s = 0.0
        self.settled = 0
        self._mark = time.monotonic()
        self._log = tempfile.NamedTemporaryFile(prefix="autotune-compile-", suffix=".log", delete=False)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="compile-pool", daemon=True)
        self._thread.start()

    # -- the search's side (any thread)
    def submit(self, items: Iterable[tuple[Hashable, str, str, tuple]]) -> None:
        """(key, problem key, tactic json, priority) each; a key already known keeps its state
        (a queued one takes the better priority)."""
        with self._cv:
            self._tick()
            for key, pk, tj, prio in items:
                if key in self._items and key not in self._queued:
                    continue        # in flight or settled
                self._items[key] = (pk, tj)
                if key not in self._queued or prio < self._queued[key]:
                    self._queued[key] = prio
                    heapq.heappush(self._heap, (prio, next(self._seq), key))
        self._wake()

    def warm(self, k: int | None = None) -> None:
        """Start up to k workers (default n) now, before anything is queued: their imports run
        while the search still plans."""
        with self._cv:
            for _ in range(min(self.n if k is None else k, self.n) - len(self._workers)):
                self._workers.append(_Worker(self.families, self._log, self.preload))
        self._wake()

    def result(self, key: Hashable) -> Result | None:
        with self._cv:
            return self._results.get(key)

    def known(self, key: Hashable) -> bool:
        with self._cv:
            return key in self._items

    def wait(self, keys: Iterable[Hashable], *, slice_s: float = 0.5, tick=lambda dt: None) -> dict:
        """Block until every key (submitted before) is settled; those still queued go first.
        `tick(seconds)` is called after each slice waited (a stage recorder). Raises the pool's
        error (a worker that cannot start) or PoolClosed."""
        keys = list(dict.fromkeys(keys))
        with self._cv:
            unknown = [k for k in keys if k not in self._items]
            if unknown:
                raise KeyError(f"never submitted to the compile pool: {unknown[0]!r}")
            left = [k for k in keys if k not in self._results]
            if left:
                urgent = (-1, next(self._seq))
                for k in left:
                    if k in self._queued:
                        self._queued[k] = urgent
                        heapq.heappush(self._heap, (urgent, next(self._seq), k))
                self._tick()
                self.waiters += 1
                self._wake()
                try:
                    while not self.error and not self.closed and any(k not in self._results for k in left):
                        t0 = time.monotonic()
                        self._cv.wait(slice_s)
                        tick(time.monotonic() - t0)
                finally:
                    self._tick()
                    self.waiters -= 1
            if self.error is not None:
                raise self.error
            if any(k not in self._results for k in keys):
                raise PoolClosed("the compile pool was closed")
            return {k: self._results[k] for k in keys}

    def drain(self) -> list[tuple[Hashable, tuple[str, str], Result]]:
        """(key, (problem key, tactic json), result) of every item settled since the last drain."""
        with self._cv:
            new, self._new = self._new, []
            return [(k, self._items[k], self._results[k]) for k in new]

    def close(self) -> int:
        """Stop: queued items are dropped, compiles in flight are killed (neither is a failure).
        Returns how many items were left uncompiled."""
        with self._cv:
            if self.closed:
                return 0
            self._tick()
            self.closed = True
            left = len(self._queued) + sum(w.item is not None for w in self._workers)
            self._cv.notify_all()
        self._wake()
        self._thread.join()
        for w in self._workers:      # all at once: they exit side by side, not one after another
            w.hang_up()
        for w in self._workers:
            w.close()
        self._workers = []
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass
        return left

    # -- internals (under self._cv unless said otherwise)
    def _tick(self) -> None:
        now = time.monotonic()
        if self.waiters == 0 and (self._queued or any(w.item for w in self._workers)):
            self.overlapped_s += now - self._mark
        self._mark = now

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _settle(self, w: _Worker, result: Result) -> None:
        self._tick()
        key = w.item[0]
        w.item = None
        self._results[key] = result
        self._new.append(key)
        self.settled += 1
        self._cv.notify_all()

    def _what(self, key: Hashable) -> str:
        pk, tj = self._items[key]
        return f"precompiling {Tactic.from_json(tj)} for {pk}"

    def _feed(self) -> None:
        """Give queued items to idle workers, start workers for what still waits (at most n)."""
        self._workers = [w for w in self._workers if not w.dead]
        idle = [w for w in self._workers if w.ready and w.item is None]
        while self._heap and idle:
            prio, _, key = heapq.heappop(self._heap)
            if self._queued.get(key) != prio:
                continue            # stale: raised since, or already given out
            del self._queued[key]
            self._tick()
            idle.pop().request(key, *self._items[key], self.arch_name, self.timeout_s)
        starting = sum(not w.ready for w in self._workers)
        for _ in range(min(self.n - len(self._workers), len(self._queued) - starting)):
            self._workers.append(_Worker(self.families, self._log, self.preload))

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if self.closed:
                        return
                    self._feed()
                    now = time.monotonic()
                    waits = [w.item[1].remaining() for w in self._workers if w.item] + \
                            [max(0.0, w.started + START_TIMEOUT_S - now) for w in self._workers if not w.ready]
                    workers = list(self._workers)
                timeout = min(waits) if waits else None
                sel = selectors.DefaultSelector()
                sel.register(self._wake_r, selectors.EVENT_READ, None)
                for w in workers:
                    sel.register(w.p.stdout, selectors.EVENT_READ, w)
                ready = sel.select(timeout)
                sel.close()
                lines = [(key.data, key.data.p.stdout.readline()) for key, _ in ready if key.data is not None]
                if any(key.data is None for key, _ in ready):
                    os.read(self._wake_r, 4096)
                with self._cv:
                    if self.closed:
                        return
                    for w, line in lines:
                        self._reply(w, line)
                    self._deadlines()
        except BaseException as e:      # a worker that cannot start, or a bug: every waiter hears it
            with self._cv:
                self.error = e if isinstance(e, WorkerStartError) else WorkerStartError(
                    f"the compile pool failed: {type(e).__name__}: {e}")
                self._cv.notify_all()

    def _reply(self, w: _Worker, line: str) -> None:
        if not w.ready:
            if not line:
                raise WorkerStartError(f"a compile worker could not start: {w.died('starting')[0]}" + self._tail())
            w.ready = True
            return
        if w.item is None:
            if not line:
                w.dead = True
                w.p.wait()
            return
        if not line:
            self._settle(w, w.died(self._what(w.item[0])))
            return
        reply = json.loads(line)
        self._settle(w, (reply.get("err"), reply.get("smem"), None))

    def _deadlines(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if not w.ready and not w.dead and now >= w.started + START_TIMEOUT_S:
                raise WorkerStartError(f"a compile worker did not start within {START_TIMEOUT_S:g} s" + self._tail())
            if w.item is not None and w.item[1].expired():
                what = self._what(w.item[0])
                w.kill()
                self._settle(w, (f"timed out after {self.timeout_s:g} s while {what}; compile worker killed",
                                 None, int(signal.SIGKILL)))

    def _tail(self) -> str:
        try:
            lines = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f" ({lines[-1][:200]})" if lines else ""


def compile_all(items: list[tuple[str, str]], arch_name: str, n_jobs: int, families: dict, *,
                timeout_s: float, isolate: bool = True) -> list[Result]:
    """Compile (problem key, tactic json) pairs for an arch in n_jobs worker processes, each
    request under timeout_s, and wait for all. Returns (error or None, smem or None, exit signal
    or None) per item, in order. Raises WorkerStartError when a worker cannot start at all."""
    if not items:
        return []
    if not isolate:
        return [(*compile_one(pk, tj, arch_name, families), None) for pk, tj in items]
    pool = Pool(arch_name, min(n_jobs, len(items)), families, timeout_s=timeout_s)
    try:
        pool.submit((i, pk, tj, (0,)) for i, (pk, tj) in enumerate(items))
        got = pool.wait(range(len(items)))
    finally:
        pool.close()
    return [got[i] for i in range(len(items))]


def main() -> int:
    # the protocol owns the real stdout; whatever a compiler prints goes to stderr (the log)
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    hello = json.loads(sys.stdin.readline() or "{}")
    families = hello.get("families", {})
    for name, path in families.items():
        registry.FAMILIES.setdefault(name, path)
    for name in hello.get("preload", ()):      # warm: the families' imports before the first request
        try:
            registry.get(name)
        except Exception:
            pass                                # said again, per tactic, by the request that needs it
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        err, smem = compile_one(msg["problem"], msg["tactic"], msg["arch"], families)
        proto.write(json.dumps({"err": err, "smem": smem}) + "\n")
    return 0


if __name__ == "__main__":
    exit_now(main())
