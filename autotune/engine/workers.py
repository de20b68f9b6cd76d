"""Where measurements run: in-process, in one spawned worker process per device, or on a Ray cluster.

An executor answers `setup / check / time` (autotune.engine.worker.Bench). `ProcessExecutor` keeps one
worker process alive across jobs and restarts it when a request times out, the process dies
(segfault, abort, os._exit) or a CUDA error leaves its context unusable; the request that
caused it fails with `WorkerLost`, carrying the reason and the exit signal, and the next request
starts a fresh worker that replays the current setup.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from autotune.engine import deadline, precompile, strategies, timing
from autotune.engine.precompile import signal_name as _signal_name
from autotune.engine.executor import Executor, Outcome, TacticError, WorkerLost, WorkerStartError
from autotune.engine.strategies.base import HalvingStrategy
from autotune.engine.options import DEFAULT_TIMEOUT_S, Runner  # noqa: F401  (declared with every other knob)
from autotune.engine.sink import Collect, Sink
from autotune.engine.stages import Stages  # noqa: F401  (re-exported)
from autotune.engine.worker import Bench, EXIT_POISONED, error_text
from autotune.core import settings
from autotune.core.tactic import Tactic
from autotune.tactics import registry

#: first reply of a new worker (imports torch, Triton, CUDA init) may take this long
START_TIMEOUT_S = 180.0


class InlineExecutor:
    """No isolation: for tests and for debugging a tactic under a debugger."""

    def __init__(self, device: str):
        self.device = device
        self._b = Bench(device)

    def setup(self, problem_key: str, bucket: int, seed: int) -> None:
        self._call(self._b.setup, problem_key, bucket, seed)

    def _call(self, fn, *a):
        try:
            return fn(*a)
        except Exception as e:
            raise TacticError(error_text(e)) from e

    def check(self, tactic: Tactic) -> dict:
        return self._call(self._b.check, tactic)

    def time(self, tactic: Tactic, timer: timing.TimerConfig) -> dict:
        return self._call(self._b.time, tactic, timer)

    def replay(self, tactic: Tactic) -> dict:
        return self._call(self._b.replay, tactic)

    def forget(self, tactic: Tactic) -> None:
        self._b.forget(tactic.id)

    def end_job(self) -> dict:
        return self._b.end_job()

    def recycle(self) -> None:
        """No process to restart: a new Bench (the old one's tensors go with it)."""
        self._b.clear()
        self._b = Bench(self.device)

    def close(self) -> None:
        pass


class ProcessExecutor:
    """One spawned worker process, pinned to one GPU (CUDA_VISIBLE_DEVICES) when `gpu` is set."""

    def __init__(self, device: str, gpu: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 families: dict[str, str] | None = None):
        self.device, self.gpu, self.timeout_s = device, gpu, timeout_s
        self._families = dict(families or {})
        self._p: subprocess.Popen | None = None
        self._setup: dict | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="autotune-worker-", suffix=".log", delete=False)
        self.restarts = 0
        self.pids: list[int] = []
        self._spawning = False          # spawned, its ready line not read yet

    # -- process management
    def spawn(self) -> "ProcessExecutor":
        """Start the process and let it import and initialize meanwhile (the search plans while a
        worker imports torch and the families); the first request waits for it to be ready."""
        if self._p is None:
            self._spawn()
        return self

    def _start(self) -> None:
        if self._p is None:
            self._spawn()
        self._spawning = False
        try:
            self._recv(START_TIMEOUT_S, "starting")
        except WorkerLost as e:
            raise WorkerStartError(f"a measuring worker could not start: {e.reason}") from None
        if self._setup is not None:
            self._request(self._setup, START_TIMEOUT_S)

    def _spawn(self) -> None:
        env = dict(os.environ)
        if self.gpu is not None:     # index g of the devices this process sees, not physical device g
            visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[self.gpu] if self.gpu < len(visible) else str(self.gpu)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault(settings.PDL, "0")   # a trial times its kernel alone (no overlap with the one before)
        self._p = subprocess.Popen([sys.executable, "-m", "autotune.engine.worker"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=self._log, env=env, text=True, bufsize=1)
        self.pids.append(self._p.pid)
        self._send({"device": self.device, "families": self._families})
        self._spawning = True

    def _send(self, msg: dict) -> None:
        try:
            self._p.stdin.write(json.dumps(msg) + "\n")
            self._p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass   # the death shows up in _recv with its exit status

    def _recv(self, timeout: float, what: str, tactic_json: str | None = None) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self._p.stdout, selectors.EVENT_READ)
        d = deadline.make(timeout, tactic_json)
        ready = sel.select(d.remaining())
        while not ready and not d.expired():
            ready = sel.select(d.remaining())
        sel.close()
        if not ready:
            self._kill()
            raise WorkerLost(f"timed out after {timeout:g} s while {what}; worker killed", signal.SIGKILL)
        line = self._p.stdout.readline()
        if not line:
            rc = self._p.wait()
            self._p = None
            tail = self._log_tail()
            if rc < 0:
                why = f"worker died with {_signal_name(-rc)} while {what}"
                raise WorkerLost(why + (f" ({tail})" if tail else ""), -rc)
            raise WorkerLost(f"worker exited with status {rc} while {what}" + (f" ({tail})" if tail else ""), None)
        return json.loads(line)

    def _kill(self) -> None:
        if self._p is not None:
            self._p.kill()
            self._p.wait()
            self._p = None
        self._spawning = False

    def _log_tail(self) -> str:
        try:
            lines = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def _request(self, msg: dict, timeout: float) -> dict:
        if self._p is None or self._spawning:
            self.restarts += bool(self.pids) and not self._spawning
            self._start()
        what = msg["op"] + (f" {Tactic.from_json(msg['tactic'])}" if "tactic" in msg else "")
        self._send(msg)
        reply = self._recv(timeout, what, msg.get("tactic"))
        if reply.get("poisoned"):
            self._p.wait(timeout=30)
            self._p = None
            raise TacticError(reply["error"] + f" (CUDA context unusable; worker exited {EXIT_POISONED} and is restarted)")
        if not reply.get("ok"):
            raise TacticError(reply["error"])
        return reply

    # -- Executor
    def setup(self, problem_key: str, bucket: int, seed: int) -> None:
        self._setup = {"op": "setup", "problem": problem_key, "bucket": bucket, "seed": seed}
        if self._p is None or self._spawning:
            self._request({"op": "ping"}, START_TIMEOUT_S)   # starting replays the setup
        else:
            self._request(self._setup, self.timeout_s)

    def check(self, tactic: Tactic) -> dict:
        return self._request({"op": "check", "tactic": tactic.to_json()}, self.timeout_s)

    def time(self, tactic: Tactic, timer: timing.TimerConfig) -> dict:
        return self._request({"op": "time", "tactic": tactic.to_json(), "timer": asdict(timer)}, self.timeout_s)

    def replay(self, tactic: Tactic) -> dict:
        return self._request({"op": "replay", "tactic": tactic.to_json()}, self.timeout_s)

    def forget(self, tactic: Tactic) -> None:
        if self._p is not None:       # a restarted worker holds nothing of the tactic
            self._request({"op": "forget", "tactics": [tactic.id]}, self.timeout_s)

    def recycle(self) -> None:
        """Kill the worker: the next request starts a new one (and replays the setup). A fresh
        process is the one sure way back to an empty device (nothing cached, no pool held)."""
        if self._p is not None:
            self._kill()          # the next request counts the restart

    def end_job(self) -> dict:
        if self._p is None:
            return {}
        reply = self._request({"op": "end_job"}, self.timeout_s)
        return {k: reply[k] for k in ("allocated", "kept", "peak", "reserved", "peak_reserved",
                                         "captures_failed", "pools_released", "pools_kept", "live", "parts") if k in reply}

    def close(self) -> None:
        if self._p is not None:
            try:
                self._p.stdin.close()
                self._p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._kill()
            self._p = None
        try:
            os.unlink(self._log.name)
        except OSError:
            pass


# -- running jobs ---------------------------------------------------------------------------

class _Clocked:
    """An executor whose setup/check/time requests are timed into the sink's `Stages`, each one a
    heartbeat of the search."""

    def __init__(self, ex: Executor, sink: Sink):
        self._ex, self._sink, self.device = ex, sink, ex.device

    def _timed(self, stage: str, fn, *a):
        t0 = time.perf_counter()
        out = None
        try:
            out = fn(*a)
            return out
        finally:
            if self._sink.stages is not None:
                self._sink.stages.add(stage, time.perf_counter() - t0)
                # the worker's own split of a request ("check: build", "end job: collect"): where the
                # stage's time goes inside the worker, beside the whole as the search saw it
                for part, sec in (out.get("parts") or {}).items() if isinstance(out, dict) else ():
                    if isinstance(sec, (int, float)):
                        self._sink.stages.add(f"{stage}: {part}", float(sec))
            self._sink.heartbeat()

    def setup(self, *a):
        return self._timed("setup", self._ex.setup, *a)

    def check(self, *a):
        return self._timed("check", self._ex.check, *a)

    def time(self, *a):
        return self._timed("time", self._ex.time, *a)

    @property
    def replay(self):
        """The replay check, timed as its own stage; None where the executor has none (a stand-in)."""
        inner = getattr(self._ex, "replay", None)
        return None if inner is None else (lambda *a: self._timed("replay check", inner, *a))

    def forget(self, *a):
        return self._timed("forget", self._ex.forget, *a)

    def end_job(self):
        return self._timed("end job", self._ex.end_job)

    def recycle(self) -> None:
        self._timed("recycle", self._ex.recycle)

    def close(self) -> None:
        self._ex.close()


def run_job(ex: Executor, job, timer: timing.TimerConfig, halving, seed: int, sink: Sink) -> str | None:
    """One (problem, bucket) on one executor; `sink.outcome(job, o)` gets each trial as it is decided,
    and each request to the executor is timed into `sink.stages` and is a `sink.heartbeat()`.

    A tactic dropped or failed is forgotten by the worker at once, and everything of the job when it
    ends, so no tactic-sized memory outlives its job. Input setup that fails (out of memory, the
    worker lost while drawing inputs) is the job's condition, not its tactics': it is retried once
    with the same inputs (same seeds, never fewer sets), then returned as the job's reason — the
    tactics stay unmeasured, none is stored as failed. The retry runs in a fresh worker: whatever
    the old one held (a cache, a pool a failed capture kept) cannot fail it again. Returns None
    when the job was measured."""
    ex = _Clocked(ex, sink)
    why = None
    for attempt in range(2):
        if attempt:
            ex.recycle()
        try:
            ex.setup(job.problem.key, job.bucket, seed)
            why = None
            break
        except (TacticError, WorkerLost) as e:
            why = e.reason if isinstance(e, WorkerLost) else str(e)
    if why is not None:
        _end(ex, job, sink.stages)
        return f"input setup failed twice: {why}"
    gate = getattr(job, "gate", None)     # compiles still running (autotune.engine.pipeline): wait for them
    try:
        if gate is not None:
            job = gate.ready(job, sink.stages)
    except BaseException:
        _end(ex, job, sink.stages)
        raise

    def em(o: Outcome) -> None:
        sink.outcome(job, o)
        if o.status != "ok":
            try:
                ex.forget(o.tactic)
            except (TacticError, WorkerLost):
                pass           # a lost worker holds nothing; the next request restarts it
    try:
        # the job's strategy measures it (autotune/engine/strategies/: ranked walks its plan's batches,
        # each after the pool compiled it)
        wait = (lambda batch: gate.batch(batch, sink.stages)) if gate is not None else None
        strategies.get(getattr(job, "strategy", HalvingStrategy.name)).measure(ex, job, timer, halving, em, wait)
    finally:
        _end(ex, job, sink.stages)
    return None


def _end(ex: Executor, job, stages: Stages | None) -> None:
    try:
        figures = ex.end_job()
    except (TacticError, WorkerLost):
        return
    if stages is not None:
        stages.job_memory(figures or {}, f"{job.problem.key} m={job.bucket}")
    figures = figures or {}
    if figures.get("pools_kept", 0) > 0:
        # a failed capture whose pool could not be handed back (timing.abandon): its blocks stay
        # reserved for the life of the worker, so the next job starts in a new one
        ex.recycle()


def _executors(runner, device: str) -> list[tuple[str, Executor]]:
    if not runner.isolate:
        return [("inline", InlineExecutor(device))]
    if runner.gpus:
        return [(f"gpu{g}", ProcessExecutor(device, g, runner.timeout_s, runner.families)) for g in runner.gpus]
    return [(f"worker{i}", ProcessExecutor(device, None, runner.timeout_s, runner.families))
            for i in range(runner.workers)]


def prestart(runner, device: str) -> list[tuple[str, Executor]]:
    """run_local's workers, spawned now so they import while the search plans (closed by run_local,
    or by the caller when the search ends before it runs)."""
    out = _executors(runner, device)
    for _, ex in out:
        if isinstance(ex, ProcessExecutor):
            ex.spawn()
    return out


def run_local(jobs, runner, device: str, timer, halving, seed: int, sink: Sink,
              executors: list[tuple[str, Executor]] | None = None) -> None:
    """Shard jobs over one worker per device (or per `runner.workers` on the CPU): each worker
    takes the next job as it frees up, so a slow bucket does not hold the others back.
    `sink.start(job)`, called as a worker takes a job, returns the job to run (None: skip it).
    `executors`: prestart's (this closes them), else made here."""
    executors = executors or _executors(runner, device)
    if not jobs:
        for _, ex in executors:
            ex.close()
        return
    queue, held = list(jobs), {label: None for label, _ in executors}   # held: the problem each worker holds
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve(label: str, ex: Executor) -> None:
        try:
            while True:
                with lock:
                    if not queue or errors:
                        return
                    job = queue.pop(_next(queue, held, label))
                    held[label] = job.problem.key
                if (job := sink.start(job)) is None:
                    continue
                failure = run_job(ex, job, timer, halving, seed, sink) if job.tactics else None
                sink.finished(job, failure, label if job.tactics else None)
        except BaseException as e:   # a store error etc.: stop every worker, re-raise in the caller
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=serve, args=(label, ex), daemon=True) for label, ex in executors]
    try:
        if len(threads) == 1:
            serve(*executors[0])
        else:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
    finally:
        with lock:
            queue.clear()
        for _, ex in executors:
            ex.close()
    if errors:
        raise errors[0]


def _next(queue: list, held: dict, label: str) -> int:
    """The queued job worker `label` takes: the first of the problem it holds (weights drawn once a
    problem: GLM-5's experts are 404 MB), else of one no other worker holds, else the first."""
    keys, others = [j.problem.key for j in queue], {k for w, k in held.items() if w != label}
    return keys.index(held[label]) if held[label] in keys else next((i for i, k in enumerate(keys) if k not in others), 0)


# -- Ray: the same jobs over a cluster, one task per job, each on one GPU ----------------------

_RAY_EXECUTORS: dict[tuple, ProcessExecutor] = {}   # per Ray worker process, reused across its tasks


def _ray_job(job, device: str, timer: timing.TimerConfig, halving, seed: int, families: dict,
             timeout_s: float) -> tuple[str, list, dict, str | None]:
    """One job inside a Ray task: the same isolated worker and `run_job` as on one host."""
    import socket
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    key = (device, vis, tuple(sorted(families.items())))
    ex = _RAY_EXECUTORS.get(key)
    if ex is None:
        ex = _RAY_EXECUTORS[key] = ProcessExecutor(device, None, timeout_s, families)  # inherits Ray's GPU
    got = Collect()
    failure = run_job(ex, job, timer, halving, seed, got)
    state = got.stages.state() if got.stages is not None else {}
    return f"{socket.gethostname()}:{os.getpid()}" + (f":gpu{vis}" if vis else ""), got.outcomes, state, failure


def run_ray(jobs, runner, device: str, timer, halving, seed: int, sink: Sink) -> None:
    """Fan jobs out over a Ray cluster (`runner.ray` = address, or "local" for a local cluster).
    Results come back to this process, which writes them to its cache URL; for several hosts
    point --cache at a shared database or merge per-host files with `autotune cache import`.
    `sink.start` as in run_local, called for every job before the tasks are submitted."""
    jobs = [j for j in map(sink.start, jobs) if j is not None]
    for j in [j for j in jobs if not j.tactics]:
        sink.finished(j)
    jobs = [j for j in jobs if j.tactics]
    try:
        import ray
    except ImportError:
        raise WorkerStartError("--ray needs Ray: pip install 'fp4-autotune[ray]'") from None
    if not jobs:
        return
    started = False
    if not ray.is_initialized():
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            if runner.ray == "local":   # a one-machine cluster on the loopback address only
                ray.init(num_cpus=max(runner.workers, 1), _node_ip_address="127.0.0.1", **kw)
            else:
                ray.init(address=runner.ray, **kw)
        except Exception as e:
            raise WorkerStartError(f"cannot start or reach Ray at {runner.ray!r}: {error_text(e)}") from None
        started = True
    try:
        task = ray.remote(num_gpus=1 if device == "cuda" else 0, num_cpus=1, max_retries=0)(_ray_job)
        pending = {task.remote(j, device, timer, halving, seed, runner.families, runner.timeout_s): j for j in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    label, outs, spent, failure = ray.get(ref)
                except Exception as e:   # the Ray task itself died: the job's condition, no tactic's
                    label, outs, spent, failure = "ray", [], {}, f"Ray task failed: {error_text(e)}"
                if sink.stages is not None:
                    sink.stages.merge(spent)
                sink.heartbeat()
                for o in outs:
                    sink.outcome(job, o)
                sink.finished(job, failure, label)
    finally:
        if started:
            ray.shutdown()


# -- ahead-of-time compilation ------------------------------------------------------------------

def compile_all(items: list[tuple[str, str]], arch_name: str, n_jobs: int, families: dict, *,
                timeout_s: float = DEFAULT_TIMEOUT_S, isolate: bool = True) -> list[tuple]:
    """Compile (problem key, tactic json) pairs for an arch in n_jobs worker processes, each under
    timeout_s (autotune.engine.precompile). Returns (error or None, compiled smem bytes or None,
    exit signal or None) per item, in order."""
    return precompile.compile_all(items, arch_name, n_jobs, families, timeout_s=timeout_s, isolate=isolate)
