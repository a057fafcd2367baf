"""How long a queued run will wait for a slot, estimated from the runs ahead of it.

    ahead = [run_work(row, pair) for row, pair in active]    # runs holding slots
    behind = [run_work(row, pair) for row, pair in queued]   # in queue order
    waits = queue_waits(ahead, behind, limit=2, startup_s=0.4)   # {run id: s or None}
    board = QueueWaits(); board.set(waits, now)                  # the scheduler, per pass
    board.remaining(now)                                         # views: what is left

A run holding a slot frees it after its remaining steps at its own measured pace (the
seconds per step since its trainer started, evaluations and checkpoints included); a run
still starting, or queued ahead, takes its full steps at the pace of its preset's runs
that train (else of any run that trains), plus a start (the lab's median, when measured).
The queue is FIFO and a pair's two runs start together, as the scheduler does
(server/scheduler.py): a pair starts once enough slots are free. A wait that rests on a
pace nobody measured yet is None: nothing is made up. The scheduler computes the waits
once per pass (its pass pushes every queued run's view); requests read what is left.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import RunState
from crashdrill.server.views import total_steps


@dataclass(frozen=True)
class RunWork:
    """What is left of one run, for the estimate."""

    run_id: str
    pair_id: str
    preset: str  # runs of one preset train at about one pace
    steps_left: int | None  # None: its length is not known
    s_per_step: float | None  # measured since its trainer started; None: no step yet


def seconds_per_step(latest: Mapping[str, Any]) -> float | None:
    """The pace of a run's current trainer: from its `run` record (written once per process,
    before training) to its newest `step` record of the same segment, over the steps in
    between; None before that trainer's first step record."""
    step, run, resume = latest.get("step"), latest.get("run"), latest.get("resume")
    if not isinstance(step, dict) or not isinstance(run, dict):
        return None
    segment = step.get("segment", 0)
    if run.get("segment", 0) != segment:
        return None
    first = 0
    if isinstance(resume, dict) and resume.get("segment") == segment:
        first = resume.get("from_step") or 0
    t0, t1, n = run.get("t"), step.get("t"), step.get("step")
    if not (_num(t0) and _num(t1) and _num(n) and _num(first)):
        return None
    if n <= first or t1 <= t0:
        return None
    return float((t1 - t0) / (n - first))


def _num(x: Any) -> TypeGuard[float]:
    return isinstance(x, int | float) and not isinstance(x, bool)


def run_work(row: Row, pair: Row | None) -> RunWork:
    latest = json.loads(row.get("latest_json") or "{}")
    total = total_steps(pair, latest) if pair is not None else None
    queued = row.get("state") == RunState.QUEUED
    done = 0 if queued else row.get("step") or 0
    return RunWork(
        run_id=row["id"],
        pair_id=row["pair_id"],
        preset=row.get("preset") or "",
        steps_left=None if total is None else max(0, total - done),
        s_per_step=None if queued else seconds_per_step(latest),
    )


def queue_waits(
    active: Sequence[RunWork],
    queued: Sequence[RunWork],
    limit: int | None,
    startup_s: float | None,
) -> dict[str, float | None]:
    """Seconds until each queued run (in queue order) starts; None where it cannot be told.
    `limit`: runs at once (None: no limit of the lab's, a cluster's queue: not estimated)."""
    if limit is None or limit < 1:
        return {w.run_id: None for w in queued}
    paces = [w.s_per_step for w in active if w.s_per_step is not None]
    by_preset: dict[str, list[float]] = {}
    for w in active:
        if w.s_per_step is not None:
            by_preset.setdefault(w.preset, []).append(w.s_per_step)
    overall = statistics.median(paces) if paces else None
    start = startup_s or 0.0  # a start's cost only where measured

    def takes(w: RunWork, *, started: bool) -> float:
        pace = w.s_per_step
        if pace is None:
            pace = statistics.median(by_preset[w.preset]) if w.preset in by_preset else overall
        if pace is None or w.steps_left is None:
            return math.inf
        return (0.0 if started else start) + w.steps_left * pace

    # When each slot is free: the runs holding one, then the free ones (now).
    free = [takes(w, started=w.s_per_step is not None) for w in active]
    free += [0.0] * max(0, limit - len(free))
    heapq.heapify(free)
    waits: dict[str, float | None] = {}
    i = 0
    while i < len(queued):
        j = i + 1  # a pair's runs are next to each other in the queue
        while j < len(queued) and j - i < limit and queued[j].pair_id == queued[i].pair_id:
            j += 1
        pair, i = queued[i:j], j
        # The pair starts once as many slots are free as it has runs (never before a pair
        # ahead of it: the slots taken are the soonest free, so the rest are later).
        taken = [heapq.heappop(free) for _ in pair]
        at = max(taken)
        for w in pair:
            waits[w.run_id] = round(at, 1) if math.isfinite(at) else None
            heapq.heappush(free, at + takes(w, started=False))
    return waits


class QueueWaits:
    """The newest pass's estimate, as the moment each queued run should start (the
    scheduler writes it on its thread, views read it on others)."""

    def __init__(self) -> None:
        self._starts: dict[str, float | None] = {}
        self._lock = threading.Lock()

    def set(self, waits: Mapping[str, float | None], now: float) -> None:
        starts = {r: None if w is None else now + w for r, w in waits.items()}
        with self._lock:
            self._starts = starts

    def remaining(self, now: float) -> dict[str, float | None]:
        """Seconds left of each queued run's wait; None where not estimated, or where the
        estimated moment has passed (the estimate was wrong: nothing is said)."""
        with self._lock:
            starts = dict(self._starts)
        out: dict[str, float | None] = {}
        for run_id, at in starts.items():
            left = None if at is None else at - now
            out[run_id] = round(left, 1) if left is not None and left > 0 else None
        return out
