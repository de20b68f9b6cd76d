"""The deadline of one request to an isolated process (a measuring worker's check or timing, a
compile worker's precompile): past it the process is killed and the request fails "timed out".

`make(timeout_s, tactic_json)` makes each one; it is a module attribute so a test can put in
deadlines that expire on an event instead of the clock (tests/conftest.py `event_deadlines`: only a
tactic whose process said it hangs expires), and no test verdict depends on wall-clock speed."""
from __future__ import annotations

import time


class Deadline:
    """`timeout_s` seconds of the monotonic clock from now."""

    def __init__(self, timeout_s: float, tactic_json: str | None = None):
        self.at = time.monotonic() + timeout_s

    def remaining(self) -> float:
        """Seconds left (0 when expired): how long a wait for the reply may block."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at


make = Deadline
