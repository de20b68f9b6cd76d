"""Helpers shared by several test files."""
from __future__ import annotations

import os
import traceback


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
