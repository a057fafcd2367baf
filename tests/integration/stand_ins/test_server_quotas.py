"""Quotas that hold (issue #15, point 2) against the real app in-process, runs played by
the stand-in trainer: live pairs counted per address as well as per cookie, the lab's
queue limit, and pairs nobody watches stopped (server/door/quotas.py, server/housekeeping.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from crashdrill.server.settings import Settings
from tests.support.lab import free_port, serving, stand_in_app, stand_in_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

TOKEN = "teach-me-quotas-that-hold"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
HOME = ("203.0.113.7", 50000)  # one classroom's address
ELSEWHERE = ("198.51.100.9", 50000)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return stand_in_settings(tmp_path / "lab", monkeypatch, steps=5000, token=TOKEN)


def lab(settings: Settings, **changes: Any) -> FastAPI:
    return stand_in_app(settings, **changes)


def start(client: TestClient | httpx.Client, **kw: Any) -> Any:
    return client.post("/api/pairs", json={"preset": "quick"}, **kw)


def runs_of(app: FastAPI, pair: str) -> list[dict[str, Any]]:
    """The pair's runs from the database: no poll, so it does not count as watching."""
    return list(app.state.lab.store.runs_of_pair(pair))


def test_dropping_the_cookie_makes_a_new_browser_but_not_a_new_address(settings: Settings) -> None:
    app = lab(settings, max_pairs_per_address=3)
    with TestClient(app, client=HOME) as student:
        for _ in range(3):
            student.cookies.clear()  # a new browser each time
            assert start(student).status_code == 201
        student.cookies.clear()
        r = start(student)
        assert r.status_code == 429, r.text
        assert "your address already has 3 pairs" in r.json()["detail"]
        assert "max_pairs_per_address" in r.json()["detail"]
        other = TestClient(app, client=ELSEWHERE)
        assert start(other).status_code == 201  # another address is another client
        assert start(student, headers=BEARER).status_code == 201  # instructors are exempt


def test_an_address_s_live_pairs_are_bounded_in_the_bytes_they_will_write(
    settings: Settings,
) -> None:
    # lesson-1.13 as shipped: 2 runs × 9 checkpoints × 38,799,360 bytes × 2 (the mirror).
    pair_bytes = 2 * 9 * 38_799_360 * 2
    app = lab(settings, max_disk_bytes_per_address=pair_bytes + pair_bytes // 2)
    body = {"preset": "lesson-1.13"}
    with TestClient(app, client=HOME) as student:
        assert student.post("/api/pairs", json=body).status_code == 201
        student.cookies.clear()  # a new browser, the same address
        r = student.post("/api/pairs", json=body)
        assert r.status_code == 429, r.text
        detail = r.json()["detail"]
        assert f"({pair_bytes:,} bytes)" in detail and f"({pair_bytes:,})" in detail
        assert "max_disk_bytes_per_address" in detail and "raise ckpt_every" in detail
        assert TestClient(app, client=ELSEWHERE).post("/api/pairs", json=body).status_code == 201
        assert student.post("/api/pairs", json=body, headers=BEARER).status_code == 201


def test_a_class_behind_one_address_may_count_pairs_by_cookie_alone(settings: Settings) -> None:
    app = lab(settings, max_pairs_per_address=0, max_pairs_per_session=1)
    with TestClient(app, client=HOME) as first:
        others = [TestClient(app, client=HOME) for _ in range(4)]
        for browser in [first, *others]:
            assert start(browser).status_code == 201
        r = start(first)  # the cookie still counts
        assert r.status_code == 429 and "this browser already has 1 pairs" in r.json()["detail"]


def test_a_full_queue_answers_503_with_retry_after_naming_the_limit(settings: Settings) -> None:
    app = lab(settings, max_queued_runs=2, max_concurrent=2)
    with TestClient(app) as teacher:
        answers = [start(teacher, headers=BEARER) for _ in range(3)]
    full = [r for r in answers if r.status_code == 503]
    assert answers[0].status_code == 201 and full, [r.status_code for r in answers]
    assert "the lab's queue is full" in full[0].json()["detail"]
    assert "max_queued_runs" in full[0].json()["detail"]
    assert full[0].headers["Retry-After"] == "60"


def test_a_pair_nobody_watches_is_stopped_and_a_watched_one_is_not(settings: Settings) -> None:
    """Served by uvicorn (an event stream stays open while the test looks elsewhere)."""
    served = dataclasses.replace(
        settings, port=free_port(), idle_stop_s=1.5, housekeeping_interval_s=0.1, max_concurrent=6
    )
    with serving(served) as url, httpx.Client(base_url=url, timeout=30) as student:
        left, polled, streamed = (start(student).json()["pair"] for _ in range(3))
        stop = threading.Event()

        def poll() -> None:
            with httpx.Client(base_url=url, timeout=30) as watcher:
                while not stop.is_set():
                    watcher.get(f"/api/pairs/{polled}")
                    time.sleep(0.3)

        def state(pair: str) -> list[str]:  # from the database: no poll, not watching
            with contextlib.closing(sqlite3.connect(served.db_path, timeout=10)) as db:
                sql = "SELECT state FROM runs WHERE pair_id = ? ORDER BY label"
                return [row[0] for row in db.execute(sql, (pair,))]

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            with student.stream("GET", "/api/stream", params={"pair": streamed}) as events:
                lines = events.iter_lines()  # kept: a dropped iterator closes the stream
                assert next(lines) == "event: hello"
                wait_until(lambda: state(left) == ["stopped"] * 2, "the unwatched pair to stop")
                time.sleep(1.0)  # well past idle_stop_s for the two watched ones
                assert "stopped" not in state(polled) and "stopped" not in state(streamed)
        finally:
            stop.set()
            poller.join(10)
        runs = student.get(f"/api/pairs/{left}").json()["runs"]
        said = " ".join(
            e["text"]
            for r in runs
            for e in student.get(f"/api/runs/{r['id']}/events").json()["events"]
        )
        said += " ".join(r.get("message") or "" for r in runs)
        assert "Stopped by the lab: nobody watched this pair for" in said, said


def test_idle_stops_are_off_when_idle_stop_s_is_0(settings: Settings) -> None:
    app = lab(settings, idle_stop_s=0, housekeeping_interval_s=0.05)
    with TestClient(app) as student:
        pair = start(student).json()["pair"]
        time.sleep(1.0)
        assert all(r["state"] != "stopped" for r in runs_of(app, pair))
        assert app.state.lab.housekeeping.idle_stops is False


def test_the_class_settings_come_from_the_environment_with_sizes_like_20g(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashdrill.server.settings import SettingsError

    for name, value in {
        "CRASHDRILL_MAX_PAIRS_PER_ADDRESS": "0",
        "CRASHDRILL_MAX_QUEUED_RUNS": "40",
        "CRASHDRILL_IDLE_STOP_S": "600",
        "CRASHDRILL_DISK_BUDGET_BYTES": "20G",
        "CRASHDRILL_MIN_FREE_DISK_BYTES": "512MiB",
        "CRASHDRILL_MAX_PARAMS_PER_RUN": "5000000",
        "CRASHDRILL_STUDENT_UNLOCKABLE": "n_layer, d_model",
    }.items():
        monkeypatch.setenv(name, value)
    s = Settings.from_env(data_dir=tmp_path)
    assert (s.max_pairs_per_address, s.max_queued_runs, s.idle_stop_s) == (0, 40, 600.0)
    assert (s.disk_budget_bytes, s.min_free_disk_bytes) == (20 * 1024**3, 512 * 1024**2)
    assert s.max_params_per_run == 5_000_000 and s.student_unlockable == ("n_layer", "d_model")
    monkeypatch.setenv("CRASHDRILL_DISK_BUDGET_BYTES", "lots")
    with pytest.raises(SettingsError, match="CRASHDRILL_DISK_BUDGET_BYTES = 'lots'"):
        Settings.from_env(data_dir=tmp_path)
    monkeypatch.setenv("CRASHDRILL_DISK_BUDGET_BYTES", "1G")
    monkeypatch.setenv("CRASHDRILL_STUDENT_UNLOCKABLE", "lr")
    with pytest.raises(SettingsError, match="student_unlockable: lr is not locked by the server"):
        Settings.from_env(data_dir=tmp_path)
