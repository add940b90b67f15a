"""Polling with a deadline: how every test waits (none sleeps for a fixed time to wait)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail with `message` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")
