"""SIGINT and SIGTERM during a drill: stop, clean up, report what was seen.

    with stop_on_signals():          # the CLI wraps the whole drill in it
        result = verify_command(...) # raises DrillInterrupted at the first signal

The first SIGINT or SIGTERM raises DrillInterrupted in the main thread, wherever it is
(waiting on a process's output, most of the time). The drill then kills every process
tree it started (drill/engine.py kill_all, the fork server with its children), builds
the report of what it saw so far marked incomplete, and removes its temp dirs (a
`--work-dir` is kept and named in the report). A second signal while it cleans up is
ignored: the cleanup takes well under a second and must not be cut short. The command
exits with 128 + the signal number, as a shell reports a process killed by it: 130
(SIGINT), 143 (SIGTERM). A signal that was ignored when the drill started (`nohup`,
a background job of a non-interactive shell) is caught all the same.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from crashdrill.trainer.exit_codes import EXIT_SIGINT, EXIT_SIGTERM

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """What the drill exits with after this signal: 128 + its number."""
    known = {int(signal.SIGINT): EXIT_SIGINT, int(signal.SIGTERM): EXIT_SIGTERM}
    return known.get(signum, 128 + signum)


class DrillInterrupted(BaseException):
    """A SIGINT or SIGTERM reached the drill (a BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.running: Any = None  # the Segment that was running (drill/engine.py sets it)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT/SIGTERM raise DrillInterrupted once; later ones are ignored until the block
    ends. Only in the main thread (elsewhere signal handlers cannot be set): a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return  # cleaning up after the first: let it finish
        fired.append(signum)
        raise DrillInterrupted(signum)

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
