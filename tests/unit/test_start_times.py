"""How long starts take on the lab (server/start_times.py): the trainers' own figure from
their first step record, the median of the newest, nothing made up without one."""

from __future__ import annotations

import json

from crashdrill.server.start_times import StartTimes
from crashdrill.server.storage.store import NewRecord


def step(data: dict[str, object], kind: str = "step") -> NewRecord:
    text = json.dumps({"kind": kind, "segment": 0, **data}, separators=(",", ":"))
    return NewRecord("k", 0, kind, data.get("step"), 1.0, text)  # type: ignore[arg-type]


def test_without_a_start_measured_there_is_no_median() -> None:
    assert StartTimes().summary() == {"median_s": None, "count": 0}


def test_the_median_is_of_the_step_records_that_carry_the_figure() -> None:
    starts = StartTimes()
    starts.note_record(step({"step": 1, "startup_s": 2.5}))  # an exec: imports torch
    starts.note_record(step({"step": 2, "loss": 3.0}))  # not a process's first record
    starts.note_record(step({"step": 1, "startup_s": 0.4}))  # forked warm
    starts.note_record(step({"step": 7, "startup_s": 0.5}))
    starts.note_record(step({"text": '"startup_s": 9'}, kind="event"))  # not a step record
    assert starts.summary() == {"median_s": 0.5, "count": 3}


def test_figures_that_are_not_a_time_are_ignored() -> None:
    starts = StartTimes()
    for value in (None, 0, -1.0, True, "0.4"):
        starts.note_record(step({"step": 1, "startup_s": value}))
    starts.add(float("nan"))
    assert starts.summary() == {"median_s": None, "count": 0}


def test_only_the_newest_starts_count() -> None:
    starts = StartTimes(keep=3)
    for seconds in (9.0, 9.0, 9.0, 0.4, 0.4, 0.5):
        starts.add(seconds)
    assert starts.summary() == {"median_s": 0.4, "count": 3}
