"""A hold: one run's trainer stopped where it is while a student answers the lesson's
question, so that the run does not train on (or finish) while they think.

    hold = Hold(run_name)
    hold.start(proc, 60)   # SIGSTOP to the trainer's process tree; True when it is held
    hold.release()         # SIGCONT; also when the 60 s run out (a tab that was closed)
    hold.held              # whether it is held now

SIGSTOP cannot be caught: the trainer is stopped between two instructions, not asked, so
no training state changes while it is held and nothing in a checkpoint or a record knows
of it. What it costs is wall time: the step the hold fell into takes that much longer to
the clock (its tokens/s in the step record is lower), and nothing else. A SIGKILL kills a
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

import psutil

from crashdrill.workers.executor import Trainer

MAX_HOLD_S = 120.0  # no hold lasts longer, whatever is asked


class Hold:
    """The hold of one run's trainer (at most one at a time)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._proc: Trainer | None = None
        self._timer: threading.Timer | None = None

    @property
    def held(self) -> bool:
        return self._proc is not None

    def start(self, proc: Trainer, seconds: float) -> bool:
        """Stop `proc` for at most `seconds` (capped at MAX_HOLD_S); False when it is gone.
        A second start while held only moves the release time."""
        seconds = max(0.0, min(float(seconds), MAX_HOLD_S))
        with self._lock:
            if self._proc is not None and self._proc is not proc:
                self._release_locked()
            try:
                proc.signal(signal.SIGSTOP)
            except (ProcessLookupError, psutil.NoSuchProcess):
                return False
            self._proc = proc
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(seconds, self.release)
            self._timer.name = f"hold-{self._name}"
            self._timer.daemon = True
            self._timer.start()
            return True

    def release(self) -> bool:
        """Let the trainer go on (SIGCONT); False when it was not held."""
        with self._lock:
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
