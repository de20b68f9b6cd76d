"""Helpers shared by several test files."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cache=None, env=None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`autotune ARGS` as a real process of this tree (AUTOTUNE_CACHE set when `cache` is given):
    forked by tests/cli_forkserver.py (torch imported once) where its environment allows, else a
    fresh `python -m autotune.cli`; the same exit status, output and timeout either way. A command
    given more than the default time (the README's main job, tests/test_main_job.py) always runs as
    a fresh process, exactly as a user runs it: 2 s of imports are nothing beside it."""
    e = {**os.environ, **(env or {}), **({"AUTOTUNE_CACHE": str(cache)} if cache is not None else {})}
    argv = [sys.executable, "-m", "autotune.cli", *map(str, args)]
    server = _forkserver(e) if timeout <= 900 else None
    if server is None:
        return subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
    return server.run(argv, e, timeout)


class _ForkServer:
    def __init__(self, env: dict[str, str]):
        self.env, self.pid = dict(env), os.getpid()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "cli_forkserver.py")], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)   # no read-ahead: select sees every reply
        self.lock = threading.Lock()
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        atexit.register(self.close)

    def close(self) -> None:
        """EOF ends the server (between commands: each run holds the lock until its child ended)."""
        if os.getpid() == self.pid and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)

    def usable(self, env: dict[str, str]) -> bool:
        """Alive, in the process that started it (not a forked test child, e.g. as_nobody's), and
        an environment that differs only in AUTOTUNE_* variables (and pytest's own
        PYTEST_CURRENT_TEST, which it sets per test); the child gets the whole environment."""
        if os.getpid() != self.pid or self.proc.poll() is not None:
            return False
        keys = (set(env) | set(self.env)) - {"PYTEST_CURRENT_TEST"}
        return all(env.get(k) == self.env.get(k) for k in keys if not k.startswith("AUTOTUNE_"))

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory() as d:
            out, err = Path(d) / "out", Path(d) / "err"
            out.touch(), err.touch()
            req = {"args": argv[3:], "env": env, "cwd": str(ROOT), "out": str(out), "err": str(err)}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            child = json.loads(self.proc.stdout.readline())["pid"]
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:                       # as subprocess.run: kill the command, then raise
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:          # it ended as the time ran out
                    pass
            status = json.loads(self.proc.stdout.readline())["status"]
            stdout, stderr = out.read_text(), err.read_text()
        if not ready:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), stdout, stderr)


_SERVER: list[_ForkServer] = []


def _forkserver(env: dict[str, str]) -> _ForkServer | None:
    if os.environ.get("AUTOTUNE_TEST_NO_FORKSERVER") == "1" or not hasattr(os, "fork"):
        return None
    if not _SERVER:
        _SERVER.append(_ForkServer(dict(os.environ)))
    return _SERVER[0] if _SERVER[0].usable(env) else None


def as_nobody(fn) -> None:
    """Run fn in a forked child that dropped root (root ignores file permissions)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "checks failed in the unprivileged child"


def unprivileged_base(tmp_path: Path) -> Path:
    """A directory for a permission test that 'nobody' can reach: `tmp_path`, or as root a fresh one
    under /tmp (run_unprivileged removes it)."""
    return Path(tempfile.mkdtemp(dir="/tmp")) if os.geteuid() == 0 else tmp_path


def run_unprivileged(body, base: Path, read_only: Path) -> None:
    """Run the checks `body` where file permissions hold: as root (which ignores them) in a child that
    dropped root, else here. Then `read_only` (a directory the test made read-only) is made writable
    again, and as root `base` (the test's directory under /tmp, reachable by 'nobody') is removed."""
    import shutil
    root = os.geteuid() == 0
    try:
        as_nobody(body) if root else body()
    finally:
        os.chmod(read_only, 0o755)
        if root:
            shutil.rmtree(base)


def keyed(record):
    """A hand-made Trial or Winner with the code key a search of this code would store (what
    dispatch and the search require: a row without it counts as measured by other code)."""
    import dataclasses

    from autotune.core.tactic import Tactic
    from autotune.tactics import registry
    try:
        key = registry.code_key(Tactic.from_json(record.params_json), record.lib_key)
    except (ValueError, TypeError):     # a deliberately damaged row (a test of the row checks) stays as it is
        return record
    return dataclasses.replace(record, code_key=key)


def make_cache(path, winners):
    """A real SQLite cache at `path` holding `winners`, with this machine's CPU environment for the
    torch family (what a CPU search of these winners would have stored); returns `path`."""
    from autotune.cache import Store
    from autotune.core.env import cpu
    with Store(path) as s:
        s.put_environment(cpu(), ("torch",))
        for w in winners:
            s.put_winner(w)
    return path


def quiet_dispatcher(path, **kw):
    """A Dispatcher on `path` that records no misses and warns nothing (its warnings silenced too):
    for tests of the kernels and layers it serves, not of its messages."""
    import warnings

    from autotune.runtime.dispatch import Dispatcher
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(path, record_misses=False, **{"warn": False, **kw})


def dispatcher_and_warnings(path, **kw):
    """A Dispatcher on `path` (no misses recorded) and the warnings its opening gave, as text."""
    import warnings

    from autotune.runtime.dispatch import Dispatcher
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        d = Dispatcher(path, record_misses=False, **kw)
    return d, [str(w.message) for w in got]


#: the search run by `gated_search_argv`: after `after` measured trials are stored it creates the
#: marker file and blocks (the test's handshake: the process is alive, mid-search, when it is killed)
_GATE = """
import sys, time
from pathlib import Path
from autotune.cache.tables.trials import Trials
after, mark, real, seen = int(sys.argv[1]), Path(sys.argv[2]), Trials.put_trials, [0]
def put_trials(self, trials):
    real(self, trials)
    seen[0] += sum(t.bucket > 0 for t in trials)
    if seen[0] >= after:
        mark.touch()
        while True:
            time.sleep(3600)        # killed here
Trials.put_trials = put_trials
sys.argv = ["autotune", *sys.argv[3:]]
from autotune import cli
cli.main()
"""


def gated_search_argv(args: list[str], after: int, mark: Path) -> list[str]:
    """argv of `autotune ARGS` (a search) that stops once it has stored `after` measured trials:
    it then creates `mark` and blocks until killed. A kill -9 test waits for `mark` (a hang guard
    bounds the wait) and kills a process that is certainly alive, holding its job."""
    return [sys.executable, "-c", _GATE, str(after), str(mark), *map(str, args)]


def wait_for(cond, what: str, proc: subprocess.Popen | None = None, guard_s: float = 600) -> None:
    """Wait until cond() is true: an event the child causes. `guard_s` is a hang guard only (it
    ends a test that would otherwise hang, never decides a verdict); a child that exits first fails."""
    import time
    deadline = time.monotonic() + guard_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the child exited ({proc.returncode}) before {what}: "
                                 f"{err[-2000:] if isinstance(err, str) else err.decode()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"hang guard: no {what} in {guard_s:g} s")
        time.sleep(0.02)


def assert_ptxas_smem_exact(cfg, arch: str, tmp_path: Path) -> None:
    """Compile the cuda family's variant `cfg` (a build config) for `arch` with nvcc: ptxas' shared
    memory and the cubin's resource table (`cuobjdump -res-usage`, which adds the 1 KiB that sm_80+
    reserves per CTA, where cuobjdump is installed) both equal `smem_bytes(cfg)`, and nothing spills."""
    from autotune.tactics.cuda import build as B
    from tools.cuda_sass import cuobjdump
    cubin = tmp_path / "k.cubin"
    res = B.parse_ptxas(B.nvcc_compile(cfg, arch, cubin))
    assert res.smem == B.smem_bytes(cfg)
    assert not res.spills, f"{cfg} on {arch} spills: {res}"
    tool = cuobjdump()
    if tool is not None:
        table = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        assert f"SHARED:{B.smem_bytes(cfg) + 1024} " in table and "LOCAL:0 " in table, table


def assert_checked_covers_largest(kept_smem: list[int], configs) -> None:
    """The ptxas sample `configs` holds the biggest static shared memory the verdict keeps (bytes per
    kept variant in `kept_smem`), so no kept variant is judged by a term the compiler never saw."""
    from autotune.tactics.cuda import build as B
    best = max(kept_smem)
    assert best <= 48 * 1024 and best in {B.smem_bytes(c) for c in configs}


def assert_ptxas_refuses_rejected(family, problem, tactic, cfg) -> None:
    """A tactic the cuda family's verdict rejects on sm90 is one ptxas refuses (its variant `cfg`)."""
    import pytest

    from autotune.core.arch import ARCHS
    from autotune.tactics.cuda import build as B
    assert family.verdict(problem, tactic, ARCHS["sm90"]).rejected
    with pytest.raises(RuntimeError, match="too much shared data"):
        B.nvcc_resources(cfg, "sm_90")


def assert_build_and_bind_refuse_rejected(family, problem, tactic, packed) -> None:
    """A tactic the family's verdict rejects on sm90: `build` and `bind` (to the weight `packed`) each
    refuse it with the verdict's reason, before anything runs."""
    import re

    import pytest

    from autotune.core.arch import ARCHS
    v = family.verdict(problem, tactic, ARCHS["sm90"])
    assert v.rejected
    with pytest.raises(ValueError, match=re.escape(v.reason)):
        family.build(problem, tactic, "cuda")
    with pytest.raises(ValueError, match=re.escape(v.reason)):
        family.bind(problem, tactic, packed, "cuda")


@contextlib.contextmanager
def temp_caches(directory: Path, user_cache_home: Path):
    """For a module-scoped fixture (set up before the per-test autouse fixture of tests/conftest.py
    redirects the caches): while it runs, AUTOTUNE_CACHE is a file in `directory` and the user cache
    directory is `user_cache_home` (conftest's `_user_cache_home`). Yields the MonkeyPatch, for the
    fixture's own settings; all are undone on exit."""
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE", str(directory / "default-cache.db"))
        mp.setenv("XDG_CACHE_HOME", str(user_cache_home))
        yield mp
