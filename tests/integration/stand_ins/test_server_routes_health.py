"""GET /api/health: ready once the lab has started and its database answers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import crashdrill
from crashdrill.server.app import create_app
from crashdrill.server.settings import Settings
from crashdrill.server.storage.db import DatabaseUnavailable

pytestmark = pytest.mark.timeout(60)


def no_sampler(_settings: Settings) -> None:
    return None


@pytest.mark.warm
def test_health_says_ready_with_the_database_kind_and_schema_once_the_lab_started(
    tmp_path: Path,
) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "lab", telemetry=False), sampler_factory=no_sampler
    )
    with TestClient(app) as client:
        r = client.get("/api/health")
        migrated = app.state.lab.db.schema_version()
        # The warm process imports torch after the lab came up: warming, then ready.
        warm = [r.json()["warm_trainers"]]
        deadline = time.monotonic() + 60
        while warm[-1] != "ready" and time.monotonic() < deadline:
            time.sleep(0.1)
            warm.append(client.get("/api/health").json()["warm_trainers"])
    assert set(warm) <= {"warming", "ready"} and warm[-1] == "ready", warm
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and body["version"] == crashdrill.__version__
    assert body["database"] == "sqlite"
    assert body["schema_version"] == migrated > 0
    assert body["cluster"] == {  # runs are subprocesses here: always reachable
        "kind": "local",
        "address": None,
        "reachable": True,
        "since": None,
        "last_ok": None,
        "error": None,
    }
    trainers = body["trainers"]  # the built-in trainer forks from a warm process
    assert trainers["mode"] == "fork" and trainers["pid"] > 0 and trainers["error"] is None


def test_health_says_when_trainers_start_with_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_WARM_TRAINERS", "0")
    app = create_app(
        Settings(data_dir=tmp_path / "lab", telemetry=False), sampler_factory=no_sampler
    )
    with TestClient(app) as client:
        body = client.get("/api/health").json()
    trainers = body["trainers"]
    assert body["warm_trainers"] == "none"  # no warm process: nothing to wait for
    assert trainers["mode"] == "exec" and trainers["pid"] is None
    assert "CRASHDRILL_WARM_TRAINERS=0" in trainers["error"]


def test_health_answers_503_with_retry_after_while_the_database_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "lab", telemetry=False), sampler_factory=no_sampler
    )
    with TestClient(app) as client:
        db = app.state.lab.db

        def unreachable(*_args: object) -> None:
            raise DatabaseUnavailable("connection refused")

        monkeypatch.setattr(db, "one", unreachable)
        r = client.get("/api/health")
        monkeypatch.undo()
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] and "unreachable" in r.json()["detail"]
        assert client.get("/api/health").status_code == 200  # and ready again after


def test_health_says_a_max_concurrent_above_the_machine_was_clamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_WARM_TRAINERS", "0")  # no warm process needed here
    from crashdrill.server.settings import default_max_concurrent

    ceiling = default_max_concurrent()
    settings = Settings(data_dir=tmp_path / "lab", telemetry=False, max_concurrent=10 * ceiling)
    with TestClient(create_app(settings, sampler_factory=no_sampler)) as client:
        admission = client.get("/api/health").json()["admission"]
    assert admission["clamped"] is True and admission["ceiling"] == ceiling
    assert admission["max_concurrent"] == 10 * ceiling and not admission["allow_overcommit"]
    assert (
        f"max_concurrent {10 * ceiling} is more than this machine carries" in (admission["warning"])
    )
