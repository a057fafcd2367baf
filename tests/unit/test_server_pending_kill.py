"""A kill the lab signalled whose restart has written no step yet is in the run view
(`pending_kill`, `can_crash`, `can_preempt`: server/lessons/pending_kill.py, server/views.py), kept
in the run's row so that a server restart that adopts the trainer still knows it and arms
an armed crash test again (server/run_control.py `rearm`). On a real SQLite database with
its migrations; the supervisor is a stand-in that records what it was asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from crashdrill.server.errors import Conflict
from crashdrill.server.ingest_loop import IngestLoop
from crashdrill.server.run_control import RunControl
from crashdrill.server.storage.db import Database
from crashdrill.server.storage.store import Store
from crashdrill.server.views import run_view
from crashdrill.workers.launch import NotRunning
from crashdrill.workers.supervisor import Supervisor
from tests.support.rows import present

RUN = "p1-A"


class FakeSupervisor:
    grace_s = 5.0

    def __init__(self, refuse: bool = False) -> None:
        self.asked: list[str] = []
        self.refuse = refuse

    def crash(self, mode: str) -> int:
        if self.refuse:
            raise NotRunning("the trainer is not running")
        self.asked.append(mode)
        return 4242

    def preempt(self) -> int:
        self.asked.append("preempt")
        return 4242


class FakeIngest:
    def __init__(self) -> None:
        self.published: list[str] = []

    def publish_run(self, run_id: str) -> None:
        self.published.append(run_id)


def open_store(path: Path) -> Store:
    db = Database(path / "lab.sqlite3")
    db.migrate()
    return Store(db, "lab-a")


def lab_on(store: Store, sup: FakeSupervisor | None = None) -> RunControl:
    lab = RunControl()
    lab.store = store
    # the fakes stand in for the real classes: cast, as RunControl only calls what they have
    lab.supervisors = {RUN: cast(Supervisor, sup or FakeSupervisor())}
    lab.ingest = cast(IngestLoop, FakeIngest())
    lab._first_step_kills = set()
    return lab


def new_pair(store: Store, tmp_path: Path, mode: str) -> None:
    preset = {"knob": {}, "crash": {"mode": mode}}
    runs = [(f"p1-{label}", label, str(tmp_path / label)) for label in "AB"]
    store.create_pair("p1", "me", "quick", preset, runs)


def trains(store: Store, segment: int, step: int, **fields: Any) -> None:
    """A step record of `segment` is stored; the row says running in stage train."""
    latest = {"step": {"kind": "step", "segment": segment, "step": step}}
    row = {"state": "running", "stage": "train", "segment": segment, "step": step, **fields}
    store.update_run(RUN, latest_json=json.dumps(latest), **row)


def view(store: Store) -> dict[str, Any]:
    row = store.run(RUN)
    assert row is not None
    return run_view(row, present(store.pair("p1"), "pair p1"), {})


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(tmp_path)


def test_a_training_run_has_no_pending_kill_and_may_be_hit(store: Store, tmp_path: Path) -> None:
    new_pair(store, tmp_path, "kill")
    trains(store, 0, 40)
    v = view(store)
    assert v["pending_kill"] is None
    assert v["can_crash"] and v["can_preempt"]


def test_a_crash_test_is_pending_until_the_restarted_segment_writes_a_step(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "kill")
    trains(store, 0, 40)
    lab_on(store).crash(RUN, "me", False)
    v = view(store)
    assert v["pending_kill"] == {
        "kind": "crash",
        "mode": "kill",
        "armed": False,
        "first_step": False,
        "at_step": 40,
        "segment": 0,
    }
    assert not v["can_crash"] and not v["can_preempt"]
    # A late record of the killed trainer says train again: still pending.
    trains(store, 0, 41)
    assert view(store)["pending_kill"] is not None
    assert not view(store)["can_crash"]
    # The restarted segment's first step record ends it.
    trains(store, 1, 21)
    v = view(store)
    assert v["pending_kill"] is None
    assert v["can_crash"] and v["can_preempt"]


def test_an_armed_crash_test_is_armed_while_it_trains_on_and_not_once_it_landed(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "during_save")
    trains(store, 0, 120)
    answer = lab_on(store).crash(RUN, "me", False)
    assert answer["armed"] and answer["state"] == "running"
    trains(store, 0, 130)  # it trains on until its next checkpoint write
    v = view(store)
    assert v["state"] == "running"
    assert v["pending_kill"]["armed"] and v["pending_kill"]["mode"] == "during_save"
    assert v["pending_kill"]["at_step"] == 120
    assert not v["can_crash"] and not v["can_preempt"]
    with pytest.raises(Conflict, match="has a crash test armed"):
        lab_on(store).crash(RUN, "me", False)
    # The kill landed: the supervisor reports the trainer dead.
    store.update_run(RUN, state="restarting")
    v = view(store)
    assert v["pending_kill"] is not None and not v["pending_kill"]["armed"]
    trains(store, 1, 101)
    assert view(store)["pending_kill"] is None


def test_a_preemption_then_an_armed_crash_test_is_armed_whatever_the_counts_say(
    store: Store, tmp_path: Path
) -> None:
    """The page once counted crashes against segments: a preemption before makes a
    segment without a crash test, and the armed one no longer showed after a reload."""
    new_pair(store, tmp_path, "during_save")
    trains(store, 0, 60)
    lab = lab_on(store)
    lab.preempt(RUN, "me", False)
    v = view(store)
    assert v["pending_kill"]["kind"] == "preempt" and v["pending_kill"]["mode"] == "preempt"
    assert not v["pending_kill"]["armed"] and not v["can_preempt"]
    assert cast(FakeIngest, lab.ingest).published == [RUN]
    trains(store, 1, 61)  # resumed from its graceful stop's checkpoint
    assert view(store)["pending_kill"] is None
    lab.crash(RUN, "me", False)
    v = view(store)
    assert (v["segment"], v["crashes"]) == (1, 1)  # a count would say nothing is armed
    assert v["pending_kill"]["armed"] and v["pending_kill"]["segment"] == 1


def test_an_ended_run_has_no_pending_kill(store: Store, tmp_path: Path) -> None:
    new_pair(store, tmp_path, "during_save")
    trains(store, 0, 60)
    lab_on(store).crash(RUN, "me", False)
    store.update_run(RUN, state="stopped")
    assert view(store)["pending_kill"] is None


def test_after_a_server_restart_an_armed_kill_is_still_pending_and_armed_again(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    new_pair(store, tmp_path, "during_save")
    trains(store, 0, 120)
    lab_on(store).crash(RUN, "me", False)
    store.db.close()

    again = open_store(tmp_path)  # the next server, on the same database
    v = view(again)
    assert v["pending_kill"]["armed"] and not v["can_crash"]
    adopted = FakeSupervisor()
    row = again.run(RUN)
    assert row is not None
    lab_on(again, adopted).rearm(row, cast(Supervisor, adopted))
    assert adopted.asked == ["during_save"]
    assert view(again)["pending_kill"]["armed"]


def test_an_armed_kill_that_cannot_be_armed_again_is_forgotten(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    new_pair(store, tmp_path, "during_save")
    trains(store, 0, 120)
    lab_on(store).crash(RUN, "me", False)
    gone = FakeSupervisor(refuse=True)
    row = store.run(RUN)
    assert row is not None
    lab_on(store, gone).rearm(row, cast(Supervisor, gone))
    v = view(store)
    assert v["pending_kill"] is None and v["can_crash"]


def test_a_pending_crash_that_is_not_armed_is_not_signalled_again_on_adopt(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "kill")
    trains(store, 0, 40)
    lab_on(store).crash(RUN, "me", False)
    adopted = FakeSupervisor()
    row = store.run(RUN)
    assert row is not None
    lab_on(store, adopted).rearm(row, cast(Supervisor, adopted))
    assert adopted.asked == []


def starts(store: Store, **fields: Any) -> None:
    """The run is taken off the queue; its trainer has written no step record yet."""
    store.update_run(RUN, state="starting", stage="starting", step=None, **fields)


def test_a_crash_test_on_a_starting_run_is_armed_and_lands_at_its_first_step(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "kill")
    starts(store)
    sup = FakeSupervisor()
    lab = lab_on(store, sup)
    answer = lab.crash(RUN, "me", False)
    assert answer["armed"] and answer["first_step"] and answer["killed_pid"] is None
    assert sup.asked == []  # nothing to kill yet
    v = view(store)
    assert v["pending_kill"]["first_step"] and v["pending_kill"]["armed"]
    assert v["pending_kill"]["segment"] == 0 and not v["can_crash"]
    with pytest.raises(Conflict, match="lands at the trainer's first step"):
        lab.crash(RUN, "me", False)  # one press is one crash test
    store.update_run(RUN, state="running", stage="build")
    lab.fire_first_step_kill(RUN)  # stage records, no step: not yet
    assert sup.asked == []
    trains(store, 0, 0)
    lab.fire_first_step_kill(RUN)
    assert sup.asked == ["kill"]
    v = view(store)
    assert v["state"] == "restarting" and v["crashes"] == 1
    assert v["pending_kill"]["first_step"] is False and v["pending_kill"]["segment"] == 0
    lab.fire_first_step_kill(RUN)  # fired once
    assert sup.asked == ["kill"]


def test_a_crash_test_while_a_kill_s_restart_is_on_its_way_lands_in_the_next_segment(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "kill")
    trains(store, 0, 40)
    sup = FakeSupervisor()
    lab = lab_on(store, sup)
    lab.crash(RUN, "me", False)
    answer = lab.crash(RUN, "me", False)  # pressed again while it restarts
    assert answer["first_step"] and sup.asked == ["kill"]
    assert view(store)["pending_kill"]["segment"] == 1
    trains(store, 0, 41)  # a late record of the killed trainer
    lab.fire_first_step_kill(RUN)
    assert sup.asked == ["kill"]
    trains(store, 1, 21)  # the restart's first step
    lab.fire_first_step_kill(RUN)
    assert sup.asked == ["kill", "kill"] and view(store)["crashes"] == 2


def test_a_run_past_its_training_is_still_refused(store: Store, tmp_path: Path) -> None:
    new_pair(store, tmp_path, "kill")
    store.update_run(RUN, state="running", stage="finished", step=100)
    with pytest.raises(Conflict, match="in stage 'finished'"):
        lab_on(store).crash(RUN, "me", False)


def test_an_armed_first_step_crash_whose_trainer_ended_is_forgotten_saying_so(
    store: Store, tmp_path: Path
) -> None:
    new_pair(store, tmp_path, "kill")
    starts(store)
    gone = FakeSupervisor(refuse=True)
    lab = lab_on(store, gone)
    lab.crash(RUN, "me", False)
    trains(store, 0, 0)
    lab.fire_first_step_kill(RUN)
    assert view(store)["pending_kill"] is None


def test_after_a_server_restart_a_first_step_crash_fires_on_adopt(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    new_pair(store, tmp_path, "kill")
    starts(store)
    lab_on(store).crash(RUN, "me", False)
    trains(store, 0, 3)  # its first steps were stored while no server watched
    adopted = FakeSupervisor()
    row = store.run(RUN)
    assert row is not None
    lab_on(store, adopted).rearm(row, cast(Supervisor, adopted))
    assert adopted.asked == ["kill"]
