"""Waiting in tests for something another thread or process does: one helper, so every
test that waits says what it waited for when it times out."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    cond: Callable[[], object], what: str, timeout: float = 30.0, every: float = 0.05
) -> None:
    """Return once `cond()` is true; fail with "timed out waiting for WHAT" after
    `timeout` seconds (a bound on a hang, never a figure the test asserts)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
