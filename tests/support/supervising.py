"""Driving a Supervisor over the stand-in trainer in a test: the changes it reports (and
waiting for one), a supervisor on a run dir under tmp_path, the run's records, and waiting
for a segment to reach a step. Shared by the supervisor, executor, mirror and checkpoint
tests, so a test that waits says what it waited for when it times out."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from crashdrill.workers.graceful_stop import Wall
from crashdrill.workers.launch import Change, Launch
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.support.lab import STAND_IN


class Changes:
    """The supervisor's on_change callback, keeping every change for the test to read."""

    def __init__(self) -> None:
        self.items: list[Change] = []
        self.cond = threading.Condition()

    def __call__(self, change: Change) -> None:
        with self.cond:
            self.items.append(change)
            self.cond.notify_all()

    def states(self) -> list[str]:
        return [c.state for c in self.items]

    def wait_for(self, state: str, count: int = 1, timeout: float = 30) -> Change:
        """The `count`-th change to `state`, once it has come; fails listing the states
        seen when it has not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.states().count(state) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {state!r} (#{count}) in {self.states()}")
                self.cond.wait(left)
            return [c for c in self.items if c.state == state][count - 1]


def supervise(tmp_path: Path, wall: Wall | None = None) -> tuple[Supervisor, Changes, RunDir]:
    """A supervisor of the stand-in trainer on tmp_path/run, polling every 50 ms."""
    changes = Changes()
    launch = Launch(tmp_path / "run", "quick", "A", command=STAND_IN)
    sup = Supervisor(launch, changes, poll_s=0.05, wall=wall)
    return sup, changes, RunDir(tmp_path / "run")


def records(rd: RunDir) -> list[dict[str, Any]]:
    """Every record the run's trainers wrote, in order."""
    lines = rd.records.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def wait_for_step(rd: RunDir, step: int, segment: int = 0, timeout: float = 20) -> None:
    """Return once `segment` has a step record at `step` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            r["kind"] == "step" and r["segment"] == segment and r["step"] >= step
            for r in (records(rd) if rd.records.exists() else [])
        ):
            return
        time.sleep(0.02)
    raise AssertionError(f"segment {segment} never reached step {step}")
