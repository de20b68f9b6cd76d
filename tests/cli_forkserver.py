"""A process that imports torch once and forks one child per `autotune` command of the tests
(tests/helpers.py's run_cli): each command still runs in its own process, as `python -m
autotune.cli ARGS` would — its own cwd, environment, stdin (/dev/null), stdout and stderr (files),
its own import of autotune, the interpreter's normal exit (atexit, non-daemon threads) and its exit
status — without the ~2 s of importing torch again each time (dozens of CLI runs per suite).

Protocol on fds 0 (requests) and 1 (replies), one JSON line each: the client sends
{"args", "env", "cwd", "out", "err"}; the server answers {"pid"} once the child is forked, then
{"status"} (os.waitpid's) when it ended. EOF on fd 0 ends the server. Only torch and SQLAlchemy are imported ahead;
the client falls back to a real subprocess when the command's environment differs from the one this
server started with in anything but AUTOTUNE_* variables (and PYTEST_CURRENT_TEST) (an env var torch or the interpreter reads
at start-up would otherwise be stale)."""
from __future__ import annotations

import json
import os
import sys


def _read_line(buf: bytearray) -> bytes | None:
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _reply(obj) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def serve() -> dict:
    """Serve until EOF (then exit); returns only in a forked child, with its request."""
    buf = bytearray()
    while True:
        line = _read_line(buf)
        if line is None:
            sys.exit(0)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return req
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"status": status})


if __name__ == "__main__":
    sys.path[0] = os.getcwd()          # as `python -m` run in the repository root puts it
    import torch  # noqa: F401         the imports every command pays; nothing of them is initialised
    try:
        import sqlalchemy  # noqa: F401    autotune.cache's (~0.5 s)
    except ImportError:
        pass
    _reply({"ready": True})
    req = serve()
    # the child: the command's process from here on; nothing below catches its exit or exceptions
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY), (2, req["err"], os.O_WRONLY)):
        f = os.open(path, flags)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["-m", *req["args"]]
    import runpy
    runpy.run_module("autotune.cli", run_name="__main__", alter_sys=True)
