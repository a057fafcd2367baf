"""A hold: one run's trainer stopped where it is while a student answers the lesson's
question, so that the run does not train on (or finish) while they think.

    hold = Hold(run_name, write_open)   # write_open(): the step of a checkpoint write the
                                        # trainer is inside now, else None
    hold.start(proc, 60)   # SIGSTOP to the trainer's process tree, outside any checkpoint
                           # write; True when it is held
    hold.release()         # SIGCONT; also when the 60 s run out (a tab that was closed)
    hold.held              # whether it is held now

SIGSTOP cannot be caught: the trainer is stopped between two instructions of a step, not
at a step boundary and not asked, so no training state changes while it is held and
nothing in a checkpoint or a record knows of it. Never inside a checkpoint write, though:
the lab's trainers say each write's begin and end on stderr (trainer/checkpoint_pause.py,
ANNOUNCE_ENV), and a trainer stopped inside one is let go on until the write has ended,
then stopped again (up to WRITE_WAIT_S; after that it is not held). A kill sent while it
is held therefore never lands inside a write that the hold kept open.

What it costs is wall time: the step the hold fell into takes that much longer to the
clock (its tokens/s in the step record is lower), and nothing else. A SIGKILL kills a
held trainer as it kills a running one, so a crash test sent while it is held costs the
steps since its newest checkpoint up to the step it was held at, exactly what the student
read; a SIGTERM (a preemption, a stop) waits in the kernel until the release.

The supervisor owns one (workers/supervisor.py) and releases it before any signal that
needs the trainer running; the lab says "held" on the run's card from the run's row
(server/run_control.py, `held_json`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable

import psutil

from crashdrill.workers.executor import Trainer

MAX_HOLD_S = 120.0  # no hold lasts longer, whatever is asked
WRITE_WAIT_S = 15.0  # how long a hold waits for a checkpoint write to end before it gives up
SETTLE_S = 0.01  # for a SIGSTOP to take hold (a line being written is finished first)


class Hold:
    """The hold of one run's trainer (at most one at a time)."""

    def __init__(self, name: str, write_open: Callable[[], int | None] = lambda: None) -> None:
        self._name = name
        self._write_open = write_open
        self._lock = threading.Lock()
        self._proc: Trainer | None = None
        self._timer: threading.Timer | None = None
        self._closed = False  # the run is stopping, or its supervisor let it go: no new hold

    @property
    def held(self) -> bool:
        return self._proc is not None

    def start(self, proc: Trainer, seconds: float) -> bool:
        """Stop `proc` for at most `seconds` (capped at MAX_HOLD_S), outside any checkpoint
        write; False when it is gone or its write did not end within WRITE_WAIT_S. A
        second start while held only moves the release time."""
        seconds = max(0.0, min(float(seconds), MAX_HOLD_S))
        with self._lock:
            if self._closed:  # a SIGSTOP now would outlive whoever could release it
                return False
            if self._proc is not None and self._proc is not proc:
                self._release_locked()
            if not self._stop_outside_write(proc):
                if self._proc is proc:
                    self._release_locked()
                return False
            self._proc = proc
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(seconds, self.release)
            self._timer.name = f"hold-{self._name}"
            self._timer.daemon = True
            self._timer.start()
            return True

    def _stop_outside_write(self, proc: Trainer) -> bool:
        """SIGSTOP `proc` at a moment it is inside no checkpoint write: stopped inside one,
        it goes on until the write has ended and is stopped again. False when it is gone
        or still writing after WRITE_WAIT_S (then it runs)."""
        deadline = time.monotonic() + WRITE_WAIT_S
        while True:
            try:
                proc.signal(signal.SIGSTOP)
            except (ProcessLookupError, psutil.NoSuchProcess):
                return False
            time.sleep(SETTLE_S)
            if self._write_open() is None:
                return True
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                proc.signal(signal.SIGCONT)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def release(self) -> bool:
        """Let the trainer go on (SIGCONT); False when it was not held."""
        with self._lock:
            return self._release_locked()

    def close(self) -> bool:
        """Release it for good: a hold asked for after this (a question answered while the
        run stops, or after a server let it go) is refused, so no SIGSTOP lands after the
        SIGCONT and leaves the trainer stopped with nobody to release it (its release timer
        dies with the server). False when it was not held."""
        with self._lock:
            self._closed = True
            return self._release_locked()

    def _release_locked(self) -> bool:
        proc, self._proc = self._proc, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if proc is None:
            return False
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            proc.signal(signal.SIGCONT)
        return True
