"""One bounded poll for tests that wait on state only visible by looking (a file another
process writes, a log line): where an event exists, wait on the event instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WAIT = 30.0


def until(what: str, check: Callable[[], Any], timeout: float = WAIT,
          every: float = 0.05) -> Any:
    """``check()``'s first true value; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
    return value
