"""Graceful stops: a SIGTERM, a SIGINT or the run's time budget ends training at a step
boundary with a complete checkpoint, and the same command resumes it, losing nothing.

    crashdrill run quick --run-dir runs/q --stop-after 11h30m    # stops before a 12 h wall
    kill -TERM <pid>     # finishes the step, saves step-N, exits 75; run it again: resumes

Spot VMs, SLURM and notebook platforms announce most deaths: SIGTERM, then SIGKILL after a
grace. The loop asks `GracefulStop.due()` after each step (the step, its eval, probe,
sample and any checkpoint write finish first: a signal never interrupts them), saves, and
exits with EXIT_STOPPED (75, trainer/exit_codes.py). A second signal while stopping
changes nothing; if the platform's SIGKILL lands inside the write, the write is atomic and
the previous checkpoint stands, and the next start says so loudly (the stop marker,
`DIR/stop.json`, still says "saving").

The time budget (`stop_after`, "11h30m", counted from the process's start) stops the run
before the wall, leaving a margin sized from what this process measured: twice its slowest
checkpoint write plus its slowest step (MIN_MARGIN_S stands in for the write until one is
measured), plus EXIT_S for the process to end.

Imports nothing but the standard library: the supervisor and the drill read its names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

# DIR/stop.json: the newest graceful stop, "saving" or "saved"
from crashdrill.trainer.run_files import STOP_MARKER

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
MIN_MARGIN_S = 5.0  # the budget's margin before any checkpoint write has been measured
EXIT_S = 2.0  # and for the process to end after its save (interpreter and torch teardown)
STOPPING_CODE, STOPPED_CODE, TORN_CODE = "stopping", "stopped_gracefully", "graceful_stop_lost"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhms]?)")
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_duration(text: str) -> float:
    """Seconds in "11h30m", "45m", "90s", "90", "1d2h"; ValueError for anything else."""
    s = str(text).strip().lower().replace(" ", "")
    if not s:
        raise ValueError("an empty duration")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"{text!r} is not a duration like 11h30m, 45m, 90s or 90")
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
        if not m.group(2) and pos < len(s):
            raise ValueError(f"{text!r}: a bare number must be the last part")
    if total <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return total


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    h, rest = divmod(round(seconds), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where unknown): a time budget
    counts the interpreter's and torch's start too, as a platform's wall does."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class StopMarker:
    """DIR/stop.json: the newest graceful stop of the run. "saving" while its checkpoint is
    written; "saved" once it is complete. A start that finds "saving" for a step newer
    than the checkpoint it resumed knows the stop's save was cut off."""

    step: int
    reason: str
    state: str
    previous_step: int | None = None
    save_seconds: float | None = None
    grace_s: float | None = None

    def write(self, run_dir: Path) -> None:
        path = Path(run_dir) / STOP_MARKER
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.__dict__, "t": time.time()}))
        os.replace(tmp, path)

    @classmethod
    def read(cls, run_dir: Path) -> StopMarker | None:
        try:
            d = json.loads((Path(run_dir) / STOP_MARKER).read_text())
            return cls(
                step=int(d["step"]),
                reason=str(d["reason"]),
                state=str(d["state"]),
                previous_step=d.get("previous_step"),
                save_seconds=d.get("save_seconds"),
                grace_s=d.get("grace_s"),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @staticmethod
    def clear(run_dir: Path) -> None:
        (Path(run_dir) / STOP_MARKER).unlink(missing_ok=True)


class GracefulStop:
    """Why and when this process should stop; the signal handlers that set it.

    `reason` is "SIGTERM", "SIGINT" or "stop_after" once a stop is due, else None."""

    def __init__(
        self,
        *,
        grace_s: float,
        stop_after_s: float | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        self.grace_s = grace_s
        self.stop_after_s = stop_after_s
        self.enabled = enabled
        self.clock = clock
        # the wall counts from the process's start, interpreter and imports included
        self.started = clock() - process_age_s() if started is None else started
        self.reason: str | None = None
        self.requested_at: float | None = None
        self.signals_seen = 0
        self.slowest_save_s: float | None = None
        self.slowest_step_s = 0.0
        self._previous: dict[int, Any] = {}

    # ---- signals --------------------------------------------------------------------

    def install(self) -> bool:
        """Catch SIGTERM and SIGINT (main thread only); False when it cannot or is off."""
        if not self.enabled:
            return False
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: signals stay as they were
            self.restore()
            return False
        return True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only flags here: the loop acts at the next step boundary. A second signal while
        # stopping is counted and otherwise ignored: the save in progress must finish.
        self.signals_seen += 1
        if self.reason is None:
            self.request(signal.Signals(signum).name)

    def request(self, reason: str) -> None:
        self.reason = reason
        self.requested_at = self.clock()

    # ---- the time budget ------------------------------------------------------------

    def note_save(self, seconds: float) -> None:
        self.slowest_save_s = max(self.slowest_save_s or 0.0, seconds)

    def note_step(self, seconds: float) -> None:
        self.slowest_step_s = max(self.slowest_step_s, seconds)

    def margin_s(self) -> float:
        """What the budget keeps free before the wall: twice the slowest checkpoint write,
        the slowest step (the one that may be in flight when it is due) and EXIT_S."""
        save = MIN_MARGIN_S if self.slowest_save_s is None else 2 * self.slowest_save_s
        return save + self.slowest_step_s + EXIT_S

    def budget_left_s(self) -> float | None:
        if self.stop_after_s is None:
            return None
        return self.stop_after_s - (self.clock() - self.started)

    def due(self) -> bool:
        """True when the loop must stop now: a signal came, or the budget's margin is
        reached (checked at each step boundary)."""
        if self.reason is not None:
            return True
        left = self.budget_left_s()
        if left is not None and left <= self.margin_s():
            self.request("stop_after")
        return self.reason is not None

    def grace_left_s(self) -> float:
        """Seconds of grace left since the stop was asked for (the full grace before)."""
        if self.requested_at is None:
            return self.grace_s
        return self.grace_s - (self.clock() - self.requested_at)

    def why(self) -> str:
        if self.reason == "stop_after":
            return f"its time budget (stop_after {fmt_duration(self.stop_after_s or 0.0)})"
        return str(self.reason)


class _Records(Protocol):  # what stop_and_save needs of the trainer's RecordWriter
    def event(
        self, code: str, text: str, level: str | None = None, **fields: Any
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class StopOutcome:
    step: int
    checkpoint: Path | None
    save_seconds: float  # from the stop's request to a complete checkpoint (and mirror)
    within_grace: bool
    mirrored: bool | None  # None: no mirror set


def stop_and_save(
    stop: GracefulStop,
    step: int,
    run_dir: Path,
    rec: _Records,
    save: Callable[[], Path | None],
    previous_step: int | None,
    flush: Callable[[float], bool] | None = None,
) -> StopOutcome:
    """The graceful stop at `step`: say so, make sure a complete checkpoint of `step`
    exists (`save` writes it unless it already does, waits for a background write, and
    returns its directory), copy it to the mirror within what is left of the grace, say
    how long it took against the grace, and print the loud line."""
    why = stop.why()
    grace = stop.grace_s
    left = stop.budget_left_s()
    budget = (
        ""
        if left is None
        else f"; {fmt_duration(left)} of the budget left, margin {fmt_duration(stop.margin_s())}"
    )
    rec.event(
        STOPPING_CODE,
        f"Stopping gracefully at step {step} after {why}: saving a checkpoint"
        f" ({fmt_duration(stop.grace_left_s())} of grace left{budget}).",
        step=step,
    )
    print(
        f"crashdrill: {why} at step {step}: saving a checkpoint before exiting",
        file=sys.stderr,
        flush=True,
    )
    StopMarker(step, stop.reason or why, "saving", previous_step, grace_s=grace).write(run_dir)
    path = save()
    mirrored = flush(max(0.0, stop.grace_left_s())) if flush is not None else None
    took = stop.clock() - (stop.requested_at or stop.clock())
    within = took <= grace
    StopMarker(step, stop.reason or why, "saved", previous_step, round(took, 3), grace).write(
        run_dir
    )
    name = path.name if path is not None else f"step {step}"
    mirror_words = {None: "", True: ", copied to the mirror", False: ", NOT yet on the mirror"}
    rec.event(
        STOPPED_CODE,
        f"Stopped gracefully at step {step} after {why}: checkpoint {name} complete in"
        f" {took:.2f}s of a {grace:g}s grace{mirror_words[mirrored]}; 0 steps lost."
        + (
            ""
            if within
            else " The save took longer than the grace: a platform would have killed it first."
        ),
        level="info" if within and mirrored is not False else "warn",
        step=step,
        reason=stop.reason,
        checkpoint_step=step,
        save_seconds=round(took, 4),
        grace_s=grace,
        within_grace=within,
        mirrored=mirrored,
    )
    print(
        f"crashdrill: stopped gracefully at step {step} after {why}; checkpoint {name};"
        " resume with the same command",
        file=sys.stderr,
    )
    return StopOutcome(step, path, took, within, mirrored)


def check_previous_stop(run_dir: Path, resumed_step: int, rec: _Records) -> None:
    """At a start: a stop marker still "saving" means the last graceful stop was killed
    inside its write; say loudly which checkpoint stood instead and what that cost. The
    marker is cleared either way (the supervisor reads it between the two processes)."""
    marker = StopMarker.read(run_dir)
    StopMarker.clear(run_dir)
    if marker is None or marker.state != "saving" or resumed_step >= marker.step:
        return
    lost = marker.step - resumed_step
    text = (
        f"The graceful stop at step {marker.step} ({marker.reason}) was killed before its"
        f" checkpoint was complete (a {marker.grace_s:g}s grace was too short for the write);"
        f" the previous checkpoint stood: resumed at step {resumed_step}, {lost} steps lost."
    )
    print(f"crashdrill: WARNING {text}", file=sys.stderr)
    rec.event(TORN_CODE, text, step=marker.step, lost_steps=lost)
