"""The queue's wait estimate (server/queue_wait.py): runs ahead at their measured pace,
FIFO, a pair's runs together, None where no pace was measured."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crashdrill.server.queue_wait import (
    QueueWaits,
    RunWork,
    queue_waits,
    run_work,
    seconds_per_step,
)


def work(
    run_id: str, pair: str, left: int | None, pace: float | None, preset: str = "quick"
) -> RunWork:
    return RunWork(run_id, pair, preset, left, pace)


def test_a_pair_waits_for_the_two_slots_the_runs_ahead_free_at_their_pace() -> None:
    active = [work("a1", "p1", 100, 0.1), work("b1", "p1", 300, 0.1)]  # 10 s and 30 s left
    queued = [work("a2", "p2", 200, None), work("b2", "p2", 200, None)]
    waits = queue_waits(active, queued, limit=2, startup_s=None)
    assert waits == {"a2": 30.0, "b2": 30.0}  # a pair starts together: when both are free


def test_queued_pairs_ahead_take_their_full_steps_plus_a_measured_start() -> None:
    active = [work("a1", "p1", 100, 0.1), work("b1", "p1", 100, 0.1)]
    queued = [work(r, p, 200, None) for r, p in [("a2", "p2"), ("b2", "p2"), ("a3", "p3")]]
    waits = queue_waits(active, queued, limit=2, startup_s=0.5)
    # p2 starts at 10 s; its runs take 0.5 s to start and 200 × 0.1 s: p3 starts at 30.5 s
    assert waits == {"a2": 10.0, "b2": 10.0, "a3": 30.5}


def test_free_slots_start_a_pair_at_once_and_the_next_waits_for_the_soonest() -> None:
    active = [work("a1", "p1", 50, 0.2)]  # 10 s left; 3 slots, 2 free
    queued = [work("a2", "p2", 10, None), work("b2", "p2", 10, None), work("a3", "p3", 10, None)]
    waits = queue_waits(active, queued, limit=3, startup_s=None)
    assert waits["a2"] == waits["b2"] == 0.0
    assert waits["a3"] == 2.0  # p2's runs end after 10 × 0.2 s, before a1


def test_a_preset_s_own_pace_is_used_before_the_lab_s_median() -> None:
    active = [
        work("a1", "p1", 10, 1.0, preset="slow"),
        work("b1", "p1", 10, 1.0, preset="slow"),
    ]
    slow = [work("a2", "p2", 10, None, "slow"), work("b2", "p2", 10, None, "slow")]
    fast = [work("a3", "p3", 10, None, "other"), work("b3", "p3", 10, None, "other")]
    waits = queue_waits(active, [*slow, *fast], limit=2, startup_s=None)
    assert waits["a2"] == 10.0
    assert waits["a3"] == 20.0  # p2 takes 10 steps at the slow preset's 1 s


def test_without_a_measured_pace_the_wait_is_not_made_up() -> None:
    active = [work("a1", "p1", 100, None), work("b1", "p1", 100, None)]  # both still starting
    queued = [work("a2", "p2", 100, None), work("b2", "p2", 100, None)]
    assert queue_waits(active, queued, limit=2, startup_s=0.4) == {"a2": None, "b2": None}
    # with free slots the start is now, whatever the paces
    assert queue_waits([], queued, limit=2, startup_s=None) == {"a2": 0.0, "b2": 0.0}
    # a cluster's queue (no limit of the lab's) is not estimated
    assert queue_waits([], queued, limit=None, startup_s=None) == {"a2": None, "b2": None}


def test_a_pair_larger_than_the_limit_starts_a_run_at_a_time() -> None:
    active = [work("a1", "p1", 10, 1.0)]
    queued = [work("a2", "p2", 5, None), work("b2", "p2", 5, None)]
    assert queue_waits(active, queued, limit=1, startup_s=None) == {"a2": 10.0, "b2": 15.0}


def row(state: str, step: int | None, latest: dict[str, Any], preset_steps: int = 300) -> dict:
    return {
        "id": "r",
        "pair_id": "p",
        "preset": "quick",
        "state": state,
        "step": step,
        "latest_json": json.dumps(latest),
    }


PAIR = {"id": "p", "preset_json": json.dumps({"run": {"steps": 300}})}


def test_the_pace_is_measured_from_the_trainer_s_run_record_to_its_newest_step() -> None:
    latest = {
        "run": {"segment": 1, "t": 100.0},
        "resume": {"segment": 1, "from_step": 50},
        "step": {"segment": 1, "step": 150, "t": 120.0},
    }
    assert seconds_per_step(latest) == pytest.approx(0.2)  # 100 steps in 20 s
    w = run_work(row("running", 150, latest), PAIR)
    assert (w.steps_left, w.s_per_step) == (150, pytest.approx(0.2))
    # an old segment's records say nothing of the new trainer's pace
    assert seconds_per_step({**latest, "run": {"segment": 2, "t": 130.0}}) is None
    assert seconds_per_step({"run": {"segment": 0, "t": 1.0}}) is None
    queued = run_work(row("queued", None, {}), PAIR)
    assert (queued.steps_left, queued.s_per_step) == (300, None)


def test_the_board_counts_down_and_says_nothing_once_the_moment_passed() -> None:
    board = QueueWaits()
    board.set({"a": 30.0, "b": None}, now=1000.0)
    assert board.remaining(1010.0) == {"a": 20.0, "b": None}
    assert board.remaining(1031.0) == {"a": None, "b": None}
