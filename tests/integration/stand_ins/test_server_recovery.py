"""A server that stops and starts again on the same data dir (in-process, stand-in
trainers): live runs are adopted, finished ones are recognised, the queue is kept."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient

from crashdrill.server.app import create_app
from crashdrill.server.settings import Settings
from tests.support.lab import STAND_IN
from tests.support.lab import wait_pair as wait_pair_30s

pytestmark = pytest.mark.timeout(90)

# Adopting a restarted server's runs takes longer than starting them: 40 s, not 30.
wait_pair = partial(wait_pair_30s, timeout=40)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "lab",
        trainer_command=STAND_IN,
        max_concurrent=2,
        telemetry=False,
        stop_runs_on_exit=False,  # the trainers outlive the server, as with kill -9
    )


def trainer_pids(settings: Settings, runs: list[dict[str, Any]]) -> list[int]:
    return [json.loads((settings.runs_dir / r["id"] / "run.json").read_text())["pid"] for r in runs]


def test_live_runs_are_adopted_and_the_queue_kept(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "120")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    with TestClient(create_app(settings)) as client:
        first = client.post("/api/pairs", json={"preset": "quick"}).json()
        second = client.post("/api/pairs", json={"preset": "quick"}).json()
        runs = wait_pair(client, first["pair"], lambda rs: all((r["step"] or 0) >= 10 for r in rs))
        pids = trainer_pids(settings, runs)
        cookies = dict(client.cookies)
    assert all(psutil.pid_exists(p) for p in pids)  # the server is gone, the runs are not
    with TestClient(create_app(settings), cookies=cookies) as client:
        runs = client.get(f"/api/pairs/{first['pair']}").json()["runs"]
        assert [r["state"] for r in runs] == ["running", "running"]
        queued = client.get(f"/api/pairs/{second['pair']}").json()["runs"]
        assert [(r["stage"], r["queue_position"]) for r in queued] == [("queued", 1), ("queued", 2)]
        run_a = first["runs"][0]["id"]
        assert client.post(f"/api/runs/{run_a}/crash").status_code == 202  # still ours
        done = lambda rs: all(r["state"] == "finished" for r in rs)  # noqa: E731
        runs = wait_pair(client, first["pair"], done)
        assert [r["step"] for r in runs] == [120, 120]
        wait_pair(client, second["pair"], done)
        texts = [e["text"] for e in client.get(f"/api/runs/{run_a}/events").json()["events"]]
        assert not [t for t in texts if "server was down" in t]
        [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
        assert check["bit_identical"] is True


def test_runs_that_ended_while_the_server_was_down_are_not_resumed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "30")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.01")
    with TestClient(create_app(settings)) as client:
        created = client.post("/api/pairs", json={"preset": "quick"}).json()
        runs = wait_pair(client, created["pair"], lambda rs: all(r["step"] for r in rs))
        pids = trainer_pids(settings, runs)
    alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    psutil.wait_procs(alive, timeout=20)  # both finish while no server watches
    with TestClient(create_app(settings)) as client:
        runs = client.get(f"/api/pairs/{created['pair']}").json()["runs"]
        assert [r["state"] for r in runs] == ["finished", "finished"]
        runs = wait_pair(client, created["pair"], lambda rs: all(r["step"] == 30 for r in rs))
        records = client.get(f"/api/runs/{runs[0]['id']}/records").json()["records"]
        assert records[-1]["text"] == "Finished 30 steps."


def test_runs_that_diverged_while_the_server_was_down_are_diverged_not_resumed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "60")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    monkeypatch.setenv("CRASHDRILL_STANDIN_DIVERGE_AT", "40")
    with TestClient(create_app(settings)) as client:
        created = client.post("/api/pairs", json={"preset": "quick"}).json()
        runs = wait_pair(client, created["pair"], lambda rs: all(r["step"] for r in rs))
        pids = trainer_pids(settings, runs)
    alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    psutil.wait_procs(alive, timeout=20)  # both diverge while no server watches
    with TestClient(create_app(settings)) as client:
        runs = client.get(f"/api/pairs/{created['pair']}").json()["runs"]
        assert [r["state"] for r in runs] == ["diverged", "diverged"]
        texts = [
            e["text"] for e in client.get(f"/api/runs/{runs[0]['id']}/events").json()["events"]
        ]
        assert not [t for t in texts if "server was down" in t]


def test_an_armed_crash_test_is_still_armed_after_a_server_restart_and_armed_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Lesson 1.10's crash mode waits for a checkpoint write, which the stand-in never
    # announces: the kill stays armed for as long as the test needs it.
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "3000")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    with TestClient(create_app(settings)) as client:
        created = client.post("/api/pairs", json={"preset": "lesson-1.10"}).json()
        pair, run_a = created["pair"], created["runs"][0]["id"]
        wait_pair(client, pair, lambda rs: rs[0]["can_crash"])
        assert client.post(f"/api/runs/{run_a}/crash").json()["armed"] is True
        [a, _] = wait_pair(client, pair, lambda rs: rs[0]["pending_kill"] is not None)
        assert a["pending_kill"]["armed"] and not a["can_crash"] and not a["can_preempt"]
        cookies = dict(client.cookies)
    with (
        caplog.at_level(logging.INFO, logger="crashdrill.server.run_control"),
        TestClient(create_app(settings), cookies=cookies) as client,
    ):
        try:
            [a, _] = client.get(f"/api/pairs/{pair}").json()["runs"]
            assert a["state"] == "running", a
            assert a["pending_kill"]["armed"] and not a["can_crash"], a
            assert f"armed the crash test of run {run_a} again" in caplog.text
            refused = client.post(f"/api/runs/{run_a}/crash")
            assert refused.status_code == 409 and "armed" in refused.json()["detail"]
        finally:
            client.post(f"/api/pairs/{pair}/stop")
            wait_pair(client, pair, lambda rs: all(r["state"] == "stopped" for r in rs))
