"""When the server takes a crash test: from the first step record of the run's newest
segment (whatever the supervisor's reports say yet), never again before the restart it
caused has written a step record, and never on a stage a late record of the killed
trainer claims (server/views.py `training`, server/ingest.py, server/run_control.py)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from crashdrill.server.ingest import run_fields_after
from crashdrill.server.ingest_loop import IngestLoop
from crashdrill.server.run_control import RunControl
from crashdrill.server.storage.store import Store
from crashdrill.server.views import training
from crashdrill.workers.supervisor import Supervisor


def run_row(state: str, stage: str, segment: int, latest: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "r1",
        "pair_id": "p1",
        "label": "A",
        "state": state,
        "stage": stage,
        "segment": segment,
        "step": (latest.get("step") or {}).get("step"),
        "crashes": 0,
        "latest_json": json.dumps(latest),
    }


def step_of(segment: int, step: int) -> dict[str, Any]:
    return {"kind": "step", "segment": segment, "step": step}


@pytest.mark.parametrize("state", ["starting", "running", "restarting"])
def test_a_trainer_that_wrote_a_step_record_of_the_newest_segment_is_training(
    state: str,
) -> None:
    latest = {"step": step_of(1, 101)}
    assert training(run_row(state, "train", 1, latest), latest)


def test_no_step_record_of_the_newest_segment_yet_is_not_training() -> None:
    latest = {"step": step_of(0, 140)}  # the killed trainer's
    assert not training(run_row("running", "train", 1, latest), latest)
    assert not training(run_row("restarting", "restarting", 0, latest), latest)
    assert not training(run_row("starting", "train", 0, {}), {})
    assert not training(run_row("finished", "train", 0, latest), latest)


def stage(segment: int, name: str) -> dict[str, Any]:
    return {"kind": "stage", "segment": segment, "stage": name, "progress": 0.5}


def restart_event(segment: int) -> dict[str, Any]:
    return {"kind": "event", "segment": segment, "code": "crash", "resume_from": 100}


def test_after_a_crash_test_a_late_stage_record_of_the_killed_trainer_is_ignored() -> None:
    row = run_row("restarting", "restarting", 0, {"step": step_of(0, 140)})
    fields = run_fields_after(row, [step_of(0, 141), stage(0, "train")])
    assert fields.get("stage", "restarting") == "restarting"


def test_the_restart_event_and_the_new_trainer_move_the_stage_in_the_file_s_order() -> None:
    row = run_row("running", "train", 0, {"step": step_of(0, 140)})
    fields = run_fields_after(row, [step_of(0, 141), restart_event(0), stage(0, "train")])
    assert fields["stage"] == "restarting"  # the supervisor's event: the trainer is gone
    fields = run_fields_after(row, [restart_event(0), stage(1, "build"), stage(1, "train")])
    assert (fields["stage"], fields["segment"]) == ("train", 1)
    # the supervisor's report of the restart, applied late, leaves the stage to the file
    later = {**row, **fields}
    assert run_fields_after(later, [step_of(1, 101)]).get("stage", "train") == "train"


class FakeSupervisor:
    def __init__(self) -> None:
        self.kills = 0
        self.grace_s = 5.0

    def crash(self, mode: str) -> int:
        self.kills += 1
        return 4242


class FakeStore:
    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row

    def run(self, run_id: str) -> dict[str, Any]:
        return self.row

    def owner_of_run(self, run_id: str) -> str:
        return "me"

    def pair(self, pair_id: str) -> None:
        return None

    def update_run(self, run_id: str, **fields: Any) -> None:
        self.row.update(fields)


class FakeIngest:
    def publish_run(self, run_id: str) -> None:
        pass


def control(row: dict[str, Any]) -> tuple[RunControl, FakeSupervisor, FakeStore]:
    lab = RunControl()
    sup = FakeSupervisor()
    store = FakeStore(row)
    # the fakes stand in for the real classes: cast, as RunControl only calls what they have
    lab.store = cast(Store, store)
    lab.supervisors = {"r1": cast(Supervisor, sup)}
    lab.ingest = cast(IngestLoop, FakeIngest())
    lab._first_step_kills = set()  # the Lab's: crash tests armed for a first step
    return lab, sup, store


def test_a_crash_test_is_taken_from_the_first_step_record_and_a_second_waits_for_the_next() -> None:
    # The restarted trainer's first step is stored; the report that it runs is not yet.
    latest = {"step": step_of(0, 5)}
    lab, sup, store = control(run_row("starting", "train", 0, latest))
    assert lab.crash("r1", "me", False)["killed_pid"] == 4242
    # A late record of the killed trainer says train again: a second press is no kill of
    # the dead trainer, it is armed for the restart's first step (issue 38), not refused.
    late = {"step": step_of(0, 6)}
    store.row.update(stage="train", state="running", latest_json=json.dumps(late))
    second = lab.crash("r1", "me", False)
    assert second["first_step"] and second["killed_pid"] is None and sup.kills == 1
    lab.fire_first_step_kill("r1")  # the late record again: not the restart's step
    assert sup.kills == 1
    # The restart's first step record: the armed kill lands, whatever the state says.
    new = {"step": step_of(1, 3)}
    store.row.update(stage="train", state="restarting", segment=1, latest_json=json.dumps(new))
    lab.fire_first_step_kill("r1")  # what the ingest calls when it stores a step record
    assert sup.kills == 2
