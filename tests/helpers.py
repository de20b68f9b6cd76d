"""Helpers shared by several test files."""
from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cache=None, env=None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`autotune ARGS` as a real subprocess of this tree (AUTOTUNE_CACHE set when `cache` is given)."""
    e = {**os.environ, **(env or {}), **({"AUTOTUNE_CACHE": str(cache)} if cache is not None else {})}
    return subprocess.run([sys.executable, "-m", "autotune.cli", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


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
