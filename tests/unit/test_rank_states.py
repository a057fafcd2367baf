"""Each rank's state (workers/rank_states.py) as the lab reads it from what the workers keep:
the run's state and stage, the ranks file its launcher wrote, and whether each rank's
process lives; and the run view's `ranks` (server/rank_view.py) with each process's
telemetry. Real processes stand in for ranks: children of this test, its "launcher"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.api.schemas import RunStatus
from crashdrill.server.rank_view import ranks_view, world_of
from crashdrill.server.views import run_view
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.rank_states import RankState, rank_states
from crashdrill.workers.telemetry import ProcessSampler

ME = os.getpid()  # the ranks' launcher, as a group's trainer process is


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(2)]  # fmt: skip
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _said(tmp_path: Path, procs: list[Any], launcher: int = ME, **more: Any) -> Path:
    pids = {str(i): p.pid for i, p in enumerate(procs)}
    said = {"launcher": launcher, "world": len(procs), "crash_rank": 1, "pids": pids, **more}
    (tmp_path / RANKS_FILE).write_text(json.dumps(said))
    return tmp_path


def _states(statuses: list[Any]) -> list[str]:
    return [s.state.value for s in statuses]


def test_both_ranks_of_a_training_group_are_training(tmp_path: Path, ranks: list[Any]) -> None:
    run_dir = _said(tmp_path, ranks)
    got = rank_states(run_dir, "running", "train", trainer_pid=ME, world=2)
    assert _states(got) == ["training", "training"]
    assert [s.pid for s in got] == [p.pid for p in ranks]
    before = rank_states(run_dir, "running", "warmup", trainer_pid=ME, world=2)
    assert _states(before) == ["starting", "starting"]


def test_a_rank_whose_process_died_is_lost_before_its_launcher_says_so(
    tmp_path: Path, ranks: list[Any]
) -> None:
    run_dir = _said(tmp_path, ranks)
    ranks[1].kill()
    ranks[1].wait()
    got = rank_states(run_dir, "running", "train", trainer_pid=ME, world=2)
    assert _states(got) == ["training", "lost"]
    assert got[1].at is None  # its launcher has not noticed yet


def test_a_watching_launcher_s_lost_rank_is_lost_with_when_and_the_rest_restart(
    tmp_path: Path, ranks: list[Any]
) -> None:
    run_dir = _said(tmp_path, ranks, lost={"rank": 1, "status": 137, "noticed_at": 100.5})
    got = rank_states(run_dir, "running", "train", trainer_pid=ME, world=2)
    assert _states(got) == ["restarting", "lost"]
    assert got[1].at == 100.5


def test_a_blind_launcher_s_survivor_waits_until_its_collective_s_deadline(
    tmp_path: Path, ranks: list[Any]
) -> None:
    lost = {"rank": 1, "status": 137, "noticed_at": 100.5, "deadline": 115.5, "launcher": "blind"}
    run_dir = _said(tmp_path, ranks, lost=lost)
    got = rank_states(run_dir, "running", "train", trainer_pid=ME, world=2)
    assert _states(got) == ["waiting", "lost"]
    assert got[0].until == 115.5
    lost["timed_out"] = {"rank": 0, "at": 115.6}
    run_dir = _said(tmp_path, ranks, lost=lost)
    after = rank_states(run_dir, "running", "train", trainer_pid=ME, world=2)
    assert _states(after) == ["restarting", "lost"]


def test_while_the_supervisor_restarts_the_group_the_last_group_s_lost_rank_stays_named(
    tmp_path: Path, ranks: list[Any]
) -> None:
    lost = {"rank": 1, "status": 137, "noticed_at": 100.5}
    run_dir = _said(tmp_path, ranks, launcher=ME + 10**6, lost=lost)  # an earlier trainer
    got = rank_states(run_dir, "restarting", "restarting", trainer_pid=None, world=2)
    assert _states(got) == ["restarting", "lost"]
    # The restarted trainer runs, its group not forked yet: the supervisor's restart is
    # over in milliseconds, the group's in seconds under load; until the new group writes
    # its own file the lost rank stays named (a page rendering twice a second saw it).
    back = rank_states(run_dir, "running", "warmup", trainer_pid=ME, world=2)
    assert _states(back) == ["restarting", "lost"]
    assert back[1].at == 100.5
    # The new group's own file: nobody is lost any more.
    run_dir = _said(tmp_path, ranks, launcher=ME, lost=None)
    forked = rank_states(run_dir, "running", "warmup", trainer_pid=ME, world=2)
    assert _states(forked) == ["starting", "starting"]
    # An earlier group's file that lost nobody (the whole group was killed): starting.
    run_dir = _said(tmp_path, ranks, launcher=ME + 10**6, lost=None)
    fresh = rank_states(run_dir, "running", "warmup", trainer_pid=ME, world=2)
    assert _states(fresh) == ["starting", "starting"]


def test_an_ended_run_s_ranks_ended_with_it(tmp_path: Path, ranks: list[Any]) -> None:
    run_dir = _said(tmp_path, ranks)
    ended = {"finished": RankState.FINISHED, "stopped": RankState.STOPPED,
             "failed": RankState.FAILED, "diverged": RankState.FAILED}  # fmt: skip
    for run_state, rank_state in ended.items():
        got = rank_states(run_dir, run_state, "finished", trainer_pid=ME, world=2)
        assert [s.state for s in got] == [rank_state] * 2


def test_the_process_sampler_reads_cpu_and_memory_and_forgets_a_gone_process(
    ranks: list[Any],
) -> None:
    sampler = ProcessSampler(min_interval_s=0.0)
    pid = ranks[0].pid
    first = sampler.read([pid])[pid]
    assert first.cpu_pct is None and first.rss_bytes and first.rss_bytes > 0
    assert sampler.read([pid])[pid].cpu_pct is not None
    assert first.gpu_mem_bytes is None or first.gpu_mem_bytes >= 0
    ranks[0].kill()
    ranks[0].wait()
    assert sampler.read([pid]) == {}
    sampler.close()


def _row(tmp_path: Path, label: str = "A", **more: Any) -> dict[str, Any]:
    row = {"id": "r1", "label": label, "state": "running", "stage": "train", "pid": ME,
           "run_dir": str(tmp_path), "stage_progress": None, "step": 10, "segment": 0,
           "crashes": 0, "message": None, "exit_code": None, "latest_json": "{}",
           "pending_kill_json": None, "held_json": None}  # fmt: skip
    return {**row, **more}


def test_a_two_rank_run_s_view_shows_each_rank_with_its_telemetry_and_a_one_rank_run_none(
    tmp_path: Path, ranks: list[Any]
) -> None:
    _said(tmp_path, ranks)
    two = {"preset_json": json.dumps({"run": {"ranks": 2}, "knob": {"name": "x", "a": 1, "b": 2}})}
    view = run_view(_row(tmp_path), two, {})
    assert [(r["rank"], r["state"]) for r in view["ranks"]] == [(0, "training"), (1, "training")]
    assert all(r["rss_bytes"] > 0 for r in view["ranks"])
    RunStatus.model_validate(view)  # the API's schema says what the view holds
    one = {"preset_json": json.dumps({"run": {}, "knob": {"name": "x", "a": 1, "b": 2}})}
    assert run_view(_row(tmp_path), one, {})["ranks"] is None


def test_the_world_size_is_the_run_s_own_record_then_the_knob_then_the_lesson_s() -> None:
    preset = {"run": {"ranks": 2}, "knob": {"name": "ranks", "a": 2, "b": 4}}
    assert world_of("B", {}, preset) == 4
    assert world_of("A", {}, preset) == 2
    assert world_of("B", {"run": {"ranks": 1}}, preset) == 1
    assert world_of("A", {}, {"run": {}, "knob": {"name": "steps"}}) == 1


def test_ranks_view_of_a_queued_run_of_two_ranks_says_both_are_starting(tmp_path: Path) -> None:
    row = _row(tmp_path, state="queued", stage=None, pid=None)
    got = ranks_view(row, {}, {"run": {"ranks": 2}})
    assert [r["state"] for r in got or []] == ["starting", "starting"]


def test_every_rank_state_the_page_styles_is_one_the_server_serves() -> None:
    css = (Path(__file__).resolve().parents[2] / "web" / "static" / "lab.css").read_text()
    styled = set(re.findall(r"\.ranks li\[data-state=(\w+)\]", css))
    assert styled and styled <= {s.value for s in RankState}, styled


def test_a_group_restarted_on_another_world_size_is_not_counted_from_the_old_group_s_file(
    tmp_path: Path, ranks: list[Any]
) -> None:
    lost = {"rank": 1, "status": 137, "noticed_at": 100.5}
    run_dir = _said(tmp_path, ranks, launcher=ME + 10**6, lost=lost)  # 2 ranks, an earlier trainer
    got = rank_states(run_dir, "restarting", "restarting", trainer_pid=None, world=4)
    assert _states(got) == ["restarting", "lost", "restarting", "restarting"]
