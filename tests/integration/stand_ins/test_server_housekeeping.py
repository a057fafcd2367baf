"""Disk for a class (issue #15, point 3): finished runs keep their records while their
checkpoints go after a while or when the lab's disk budget is spent (oldest ended first),
nothing a running run needs is deleted, and new pairs get 503 when the disk is nearly
full (server/housekeeping.py, server/door/quotas.py). Runs played by the stand-in trainer."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from crashdrill.server.lab import Lab
from crashdrill.server.settings import Settings
from tests.support.lab import FakeSampler, stand_in_app, stand_in_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return stand_in_settings(tmp_path / "lab", monkeypatch, steps=30)


def lab_app(settings: Settings, **changes: Any) -> FastAPI:
    return stand_in_app(settings, **changes)


def ckpt_of(app: FastAPI, run_id: str) -> Path:
    return Path(app.state.lab.store.run(run_id)["run_dir"]) / "ckpt"


def test_a_finished_runs_checkpoints_go_after_the_retention_time_and_its_records_stay(
    settings: Settings,
) -> None:
    app = lab_app(settings, checkpoint_retention_s=0.5, housekeeping_interval_s=0.1)
    mirror = Path(app.state.lab.settings.mirror_url)
    with TestClient(app) as student:
        made = student.post("/api/pairs", json={"preset": "quick"}).json()
        ids = [r["id"] for r in made["runs"]]
        for run_id in ids:  # the stand-in's checkpoints are not mirrored: copies of our own
            copy = mirror / run_id / "step-00000010"
            copy.mkdir(parents=True)
            (copy / "model.pt").write_bytes(b"x" * 100)
            (copy / "MANIFEST.json").write_text("{}")
        wait_until(lambda: all(any(ckpt_of(app, i).glob("step-*")) for i in ids), "checkpoints", 60)
        wait_until(
            lambda: all(app.state.lab.store.run(i)["ckpt_deleted_at"] for i in ids),
            "the finished runs' checkpoints to be deleted",
            60,
        )
        for run_id in ids:
            row = app.state.lab.store.run(run_id)
            assert row["state"] == "finished" and row["ckpt_deleted_at"] - row["ended_at"] >= 0.5
            assert not ckpt_of(app, run_id).exists()
            assert not list((mirror / run_id).glob("step-*/*"))  # the mirror's copies too
            steps = student.get(f"/api/runs/{run_id}/records", params={"kind": "step"}).json()
            assert len(steps["records"]) == 30  # the records stay
        assert student.get(f"/api/pairs/{made['pair']}").status_code == 200


def test_a_live_runs_checkpoints_stay_over_the_budget_and_go_once_it_has_ended(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "5000")  # trains until stopped
    app = lab_app(
        settings, disk_budget_bytes=1, checkpoint_retention_s=0, housekeeping_interval_s=0.05
    )
    with TestClient(app) as student:
        made = student.post("/api/pairs", json={"preset": "quick"}).json()
        run_id = made["runs"][0]["id"]
        wait_until(lambda: len(list(ckpt_of(app, run_id).glob("step-*"))) >= 2, "checkpoints", 60)
        time.sleep(0.5)  # ten passes over the budget
        assert any(ckpt_of(app, run_id).glob("step-*")), "a live run's checkpoint was deleted"
        assert app.state.lab.store.run(run_id)["ckpt_deleted_at"] is None
        for run in made["runs"]:
            assert student.post(f"/api/runs/{run['id']}/stop").status_code == 202
        wait_until(
            lambda: app.state.lab.store.run(run_id)["ckpt_deleted_at"] is not None,
            "the stopped run's checkpoints to go for the budget",
            60,
        )
        assert not ckpt_of(app, run_id).exists()
        assert app.state.lab.store.run(run_id)["state"] == "stopped"


def test_the_disk_budget_deletes_the_oldest_ended_runs_checkpoints_first(
    settings: Settings,
) -> None:
    lab = Lab(
        dataclasses.replace(
            settings, mirror="off", disk_budget_bytes=2500, checkpoint_retention_s=0
        ),
        sampler_factory=FakeSampler,
    )
    try:
        runs: list[tuple[str, str, float | None]] = [
            ("old", "finished", 100.0),
            ("older", "failed", 50.0),
            ("new", "stopped", 300.0),
        ]
        runs += [("live", "running", None)]
        for run_id, state, ended in runs:
            run_dir = settings.runs_dir / run_id
            (run_dir / "ckpt" / "step-00000010").mkdir(parents=True)
            (run_dir / "ckpt" / "step-00000010" / "model.pt").write_bytes(b"x" * 1000)
            (run_dir / "records.jsonl").write_text("")
            lab.store.create_pair(f"p-{run_id}", "o", "quick", {}, [(run_id, "A", str(run_dir))])
            lab.store.update_run(run_id, state=state, ended_at=ended)
        report = lab.housekeeping.pass_once()
        assert report.over_budget == ["older", "old"]  # 4000 bytes → 2000, oldest ended first
        assert report.checkpoint_bytes == 2000
        for run_id, kept in [("older", False), ("old", False), ("new", True), ("live", True)]:
            assert (settings.runs_dir / run_id / "ckpt").exists() is kept, run_id
            assert (settings.runs_dir / run_id / "records.jsonl").exists()
        old, new = lab.store.run("old"), lab.store.run("new")
        assert old is not None and old["ckpt_deleted_at"] is not None
        assert new is not None and new["ckpt_deleted_at"] is None
        assert lab.housekeeping.pass_once().over_budget == []  # within the budget now
    finally:
        lab.close()


def test_with_little_free_space_new_pairs_get_503_saying_so(settings: Settings) -> None:
    app = lab_app(settings, min_free_disk_bytes=2**60)
    with TestClient(app) as student:
        r = student.post("/api/pairs", json={"preset": "quick"})
        assert r.status_code == 503, r.text
        assert "the lab's disk is nearly full" in r.json()["detail"]
        assert "min_free_disk_bytes" in r.json()["detail"]
        assert r.headers["Retry-After"] == "300"
        assert student.get("/api/presets").status_code == 200  # the rest still works
