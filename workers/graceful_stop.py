"""Graceful stops as the supervisor sees them: a preemption it sends (SIGTERM, then
SIGKILL after the grace, as a spot VM or SLURM does), and what any stop cost.

    pre = Preemption(proc, grace_s=30, step=120)  # SIGTERM now, SIGKILL in 30 s unless it ends
    saved = trainer_stop(run_dir, segment)        # the trainer's stopped_gracefully event or None
    lead, level = stop_lead(pre, exit_code, saved, step, run_dir)

A trainer that stopped gracefully (exit 75, trainer/preemption.py) wrote a complete
checkpoint of its last step and a `stopped_gracefully` event: its restart resumes there,
and the event says the stop lost nothing and which step it saved. A trainer without a
handler dies on the SIGTERM itself, and one that saves too slowly is SIGKILLed when the
grace runs out: those restart from their newest complete checkpoint and the event counts
the steps lost.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from crashdrill.trainer.exit_codes import EXIT_STOPPED
from crashdrill.trainer.preemption import STOPPED_CODE, StopMarker
from crashdrill.workers.executor import Trainer
from crashdrill.workers.run_dir import RunDir

PREEMPT_GRACE_S = 30.0  # a spot VM's notice; the lab passes the preset's stop_grace
MAX_STOPS_WITHOUT_PROGRESS = 2  # graceful stops in a row at one step: the run is stuck


class Preemption:
    """SIGTERM now; SIGKILL after `grace_s` unless `cancel` comes first (the trainer
    ended). Raises ProcessLookupError when there is nothing to signal."""

    def __init__(
        self, proc: Trainer, grace_s: float, step: int | None, name: str = "Preempted"
    ) -> None:
        self.grace_s = grace_s
        self.step = step  # the last step seen when the SIGTERM went out
        self.name = name  # who sent it, for the event: "Preempted", "The session wall …"
        self.killed = False
        proc.signal(signal.SIGTERM)
        self._timer = threading.Timer(grace_s, self._kill, args=(proc,))
        self._timer.daemon = True
        self._timer.start()

    def _kill(self, proc: Trainer) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            proc.signal(signal.SIGKILL)

    def cancel(self) -> None:
        self._timer.cancel()


@dataclass
class Wall:
    """A platform's session wall, as a lesson sets it ([crash] wall_step): the lab
    preempts the run once, when its first process passes `step`."""

    step: int
    grace_s: float
    hit: bool = False
    _next_look: float = 0.0

    def due(self, run_dir: RunDir) -> bool:
        """True once, when the wall is reached (looks at the records every 0.2 s)."""
        now = time.monotonic()
        if self.hit or now < self._next_look:
            return False
        self._next_look = now + 0.2
        segment, step, _ = run_dir.last_seen()
        self.hit = segment == 0 and step is not None and step >= self.step
        return self.hit

    def name(self) -> str:
        return f"The session wall at step {self.step}"


def trainer_stop(run_dir: RunDir, segment: int) -> dict[str, Any] | None:
    """The `stopped_gracefully` event the trainer of `segment` wrote, if it did."""
    for rec in reversed(run_dir.tail_records()):
        if rec.get("segment") != segment:
            continue
        if rec.get("kind") == "event" and rec.get("code") == STOPPED_CODE:
            return rec
    return None


def is_stop(preempt: Preemption | None, code: int | None, saved: dict[str, Any] | None) -> bool:
    """A death the supervisor restarts as a stop: anything after a preemption that is a
    graceful exit or a signal, and a graceful exit nobody asked for (a time budget, a
    SIGTERM from the machine)."""
    if saved is not None or code == EXIT_STOPPED:
        return True
    return preempt is not None and code in (-signal.SIGTERM, -signal.SIGKILL, None)


def stop_lead(
    preempt: Preemption | None,
    code: int | None,
    saved: dict[str, Any] | None,
    step: int | None,
    run_dir: RunDir,
) -> tuple[str, str]:
    """The first sentence of the restart event, and its level."""
    at = f" at step {step}" if step is not None else ""
    if preempt is not None:
        lead = f"{preempt.name}: SIGTERM with a {preempt.grace_s:g}s grace, then SIGKILL"
    else:
        lead = "The trainer stopped itself"
    if saved is not None:
        took, grace = saved.get("save_seconds"), saved.get("grace_s")
        how = f" in {took:.2f}s" if isinstance(took, int | float) else ""
        words = (
            f". The trainer stopped gracefully at step {saved.get('step')}"
            f" after {saved.get('reason')}: its checkpoint was complete{how}"
        )
        if preempt is None and isinstance(grace, int | float):
            words += f" of a {grace:g}s grace"
        return (lead if preempt else "A graceful stop") + words, "info"
    if preempt is None:  # exit 75 without its event: the record did not reach us
        return f"The trainer stopped gracefully{at} (exit status {EXIT_STOPPED})", "info"
    if preempt.killed or code == -signal.SIGKILL:
        marker = StopMarker.read(run_dir.path)
        inside = ""
        if marker is not None and marker.state == "saving":
            inside = f", in the middle of its graceful save of step {marker.step}"
        return (
            f"{lead}. The trainer did not stop within the grace and was killed{at}{inside}",
            "warn",
        )
    return (
        f"{lead}. The SIGTERM ended the trainer on the spot{at}: it has no handler (graceful"
        " stops off), so it saved nothing",
        "warn",
    )


def count_the_cost(event: dict[str, Any]) -> dict[str, Any]:
    """A stop's restart event says what it cost; one that cost nothing says what it saved
    (the step it stopped at), not "0 steps"."""
    step, ckpt = event.get("at_step"), event.get("resume_from")
    if event.get("lost_steps") is None and step is not None and ckpt is not None:
        event["lost_steps"] = max(0, step - ckpt)
    lost = event.get("lost_steps")
    if lost == 0 and ckpt is not None:
        event["text"] += f" The stop lost nothing: it saved step {ckpt}, the last step it trained."
    elif lost is not None:
        event["text"] += f" The stop cost {lost} step{'' if lost == 1 else 's'}."
    return event


class StopHistory:
    """The supervisor's memory of the stops in a row, and what to do after the next one."""

    def __init__(self) -> None:
        self._steps: list[int | None] = []

    def reset(self) -> None:
        """A death that was no stop ends the row."""
        self._steps = []

    def after(
        self,
        preempt: Preemption | None,
        code: int | None,
        saved: dict[str, Any] | None,
        step: int | None,
        run_dir: RunDir,
    ) -> tuple[str, str, str | None]:
        """(lead, level, event code) of the resume; event code None when the run must fail
        instead: it stopped by itself again and again at one step (a time budget shorter
        than its start), and a restart would only loop."""
        lead, level = stop_lead(preempt, code, saved, step, run_dir)
        self._steps = [*self._steps, step][-MAX_STOPS_WITHOUT_PROGRESS:]
        stuck = len(self._steps) == MAX_STOPS_WITHOUT_PROGRESS and len(set(self._steps)) == 1
        if preempt is None and stuck:
            lead += (
                f". It stopped {MAX_STOPS_WITHOUT_PROGRESS} times in a row at step {step}"
                " without training a step in between; not restarting it again."
            )
            return lead, "error", None
        return lead, level, "preempt" if preempt is not None else "graceful_stop"
