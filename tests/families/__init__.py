"""Test-only families (registered by the tests that use them)."""
from __future__ import annotations

import os
from pathlib import Path

#: a directory: a member that hangs on purpose first creates <dir>/<its tactic id> there (the event
#: tests/conftest.py's `event_deadlines` waits on: only that tactic's request times out)
HANGING = "AUTOTUNE_TEST_HANGING"


def say_hanging(tactic) -> None:
    d = os.environ.get(HANGING)
    if d:
        Path(d, tactic.id).touch()
