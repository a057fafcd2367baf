"""Postgres as the lab's database: the setting, its errors (password masked), a dropped
connection, and the API end to end on a real Postgres (tests/support/postgres.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from crashdrill.server import serve_cli
from crashdrill.server.app import create_app
from crashdrill.server.outage import Outage
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.storage.db import (
    Database,
    DatabaseUnavailable,
    PostgresDatabase,
    open_database,
)
from tests.conftest import run_cli
from tests.support.lab import STAND_IN, free_port, wait_pair
from tests.support.postgres import PostgresServer, unavailable
from tests.support.rows import present

pytestmark = pytest.mark.timeout(90)

SECRET = "hunter2-secret"


def test_the_database_url_comes_from_the_environment_and_stays_out_of_reprs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"postgresql://lab:{SECRET}@db.example.com:5432/postgres?sslmode=require"
    monkeypatch.setenv("CRASHDRILL_DATABASE_URL", url)
    settings = Settings.from_env()
    assert settings.database_url == url
    assert SECRET not in repr(settings)
    monkeypatch.setenv("CRASHDRILL_DATABASE_URL", " ")
    assert Settings.from_env().database_url is None  # empty: SQLite, as when unset


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://lab:{SECRET}@db.example.com/lab",
        f"postgresql+psycopg://lab:{SECRET}@db.example.com/lab",
        "sqlite:///srv/lab.sqlite3",
        "db.example.com:5432/lab",
        "",
    ],
)
def test_a_url_of_another_kind_is_refused_naming_the_allowed_schemes(url: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(database_url=url)
    message = str(caught.value)
    assert message.startswith("CRASHDRILL_DATABASE_URL = ")
    assert "postgresql:// or postgres://" in message and SECRET not in message


def test_serve_refuses_a_wrong_scheme_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CRASHDRILL_DATABASE_URL", f"mysql://lab:{SECRET}@db.example.com/lab")
    assert serve_cli.main(["--data-dir", str(tmp_path), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "mysql://lab:***@db.example.com/lab" in err and "postgresql://" in err
    assert SECRET not in err


def test_serve_exits_2_naming_the_masked_url_when_the_database_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("CRASHDRILL_DATABASE_URL", f"postgresql://lab:{SECRET}@127.0.0.1:{port}/lab")
    assert serve_cli.main(["--data-dir", str(tmp_path), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert f"postgresql://lab:***@127.0.0.1:{port}/lab" in err
    assert "cannot connect to the database" in err or "pip install" in err
    assert SECRET not in err + captured.out and "Traceback" not in err
    # The data dir's lock went with the failed start: the next try may take it.
    monkeypatch.delenv("CRASHDRILL_DATABASE_URL")
    create_app(Settings(data_dir=tmp_path)).state.lab.db.close()


def test_a_wrong_password_is_reported_without_the_password(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url().replace(postgres_server.password, SECRET)
    with pytest.raises(DatabaseUnavailable) as caught:
        PostgresDatabase(url)
    message = str(caught.value)
    assert "postgresql://crashdrill:***@127.0.0.1:" in message
    assert "password authentication failed" in message
    assert SECRET not in message and postgres_server.password not in message


def test_the_setting_picks_the_database(tmp_path: Path, postgres_url: str) -> None:
    sqlite = open_database(Settings(data_dir=tmp_path))
    assert type(sqlite) is Database and sqlite.describe().startswith("SQLite at ")
    sqlite.close()
    pg = open_database(Settings(data_dir=tmp_path, database_url=postgres_url))
    assert isinstance(pg, PostgresDatabase)
    assert pg.describe().startswith("Postgres at postgresql://crashdrill:***@127.0.0.1:")
    assert pg.one("SELECT 1 AS one") == {"one": 1}
    pg.close()


def test_a_connection_the_server_drops_is_replaced(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    db = PostgresDatabase(postgres_url)
    db.migrate()
    killer = PostgresDatabase(postgres_url)

    def drop() -> None:
        pid = present(db.one("SELECT pg_backend_pid() AS pid"), "row")["pid"]
        assert killer.one("SELECT pg_terminate_backend(?) AS ok", (pid,)) == {"ok": True}
        time.sleep(0.1)

    drop()
    assert db.one("SELECT COUNT(*) AS n FROM telemetry") == {"n": 0}  # a read is retried
    drop()
    insert = "INSERT INTO telemetry (t, data) VALUES (?, ?)"
    with pytest.raises(Exception, match=r"terminat|closed|connection"):
        db.run(insert, (1.0, "{}"))  # a write is not: it may have been applied
    db.run(insert, (2.0, "{}"))  # the next statement gets a new connection
    drop()
    with pytest.raises(Exception, match=r"terminat|closed|connection"), db.transaction():
        db.run(insert, (3.0, "{}"))
    assert [r["t"] for r in db.run("SELECT t FROM telemetry ORDER BY id")] == [2.0]
    db.close()
    killer.close()


def test_the_end_of_an_outage_is_said_by_whichever_statement_gets_through_first(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The ingest loop may sleep its backoff while a supervisor's report or a request
    reaches the database first: that statement ends the outage, and the log says so."""
    caplog.set_level(logging.INFO, logger="crashdrill.test-outage")
    outage = Outage(logging.getLogger("crashdrill.test-outage"))
    db = PostgresDatabase(postgres_url)
    db.reached = outage.ok
    outage.failed(DatabaseUnavailable("the connection was lost"))
    outage.failed(DatabaseUnavailable("the connection was lost"))  # said once
    assert db.one("SELECT 1 AS one") == {"one": 1}
    assert db.one("SELECT 1 AS one") == {"one": 1}  # the end said once too
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" (")[0].split(" after")[0] for m in said] == [
        "the database is unreachable",
        "the database is reachable again",
    ]
    assert "(2 failed attempts)" in said[1] and outage.failures == 0
    db.close()


# ---- the lab on Postgres, played by the stand-in trainer ------------------------------


class NoSampler:
    def __init__(self, _settings: Settings) -> None:
        pass

    def start(self, callback: Callable[[Any], None], interval_s: float = 2.0) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_lab_keeps_its_pairs_in_postgres_across_a_restart(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "60")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    settings = Settings(
        data_dir=tmp_path / "lab",
        database_url=postgres_url,
        trainer_command=STAND_IN,
        max_concurrent=2,
        stop_runs_on_exit=True,
    )
    with TestClient(create_app(settings, sampler_factory=NoSampler)) as client:
        created = client.post("/api/pairs", json={"preset": "quick"}).json()
        pair, run_a = created["pair"], created["runs"][0]["id"]
        wait_pair(client, pair, lambda rs: (rs[0]["step"] or 0) >= 25 and rs[0]["can_crash"])
        assert client.post(f"/api/runs/{run_a}/crash").status_code == 202
        runs = wait_pair(client, pair, lambda rs: all(r["state"] == "finished" for r in rs))
        assert [(r["step"], r["segment"], r["crashes"]) for r in runs] == [(60, 1, 1), (60, 0, 0)]
        [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
        assert check["bit_identical"] is True and check["complete"] and check["points"] >= 1
        records = client.get(f"/api/runs/{run_a}/records", params={"kind": "step"}).json()
        ids = [r["id"] for r in records["records"]]
        assert ids == sorted(ids) and len(ids) == 60 + check["points"]
    with TestClient(create_app(settings, sampler_factory=NoSampler)) as client:
        runs = client.get(f"/api/pairs/{pair}").json()["runs"]
        assert [(r["state"], r["step"]) for r in runs] == [("finished", 60), ("finished", 60)]
        texts = [e["text"] for e in client.get(f"/api/runs/{run_a}/events").json()["events"]]
        assert any(t.startswith("Crash test: killed") for t in texts)


# ---- crashdrill doctor postgres -------------------------------------------------------


def test_doctor_passes_on_a_working_database_and_never_prints_the_password(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    proc = run_cli("doctor", "postgres", env={"CRASHDRILL_DATABASE_URL": postgres_url})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for step in ("connect", "round trip", "write", "create", "schema"):
        assert f"  ok    {step}" in out, out
    assert "postgresql://crashdrill:***@127.0.0.1:" in out
    assert "version 0; `crashdrill serve` applies" in out
    assert postgres_server.password not in out
    db = PostgresDatabase(postgres_url)
    db.migrate()
    db.close()
    proc = run_cli("doctor", "postgres", postgres_url)
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stdout + proc.stderr


def test_serve_exits_2_naming_the_schema_a_newer_crashdrill_left(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    db = PostgresDatabase(postgres_url)
    db.migrate()
    db.run("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", (99, "from_the_future"))
    db.close()
    monkeypatch.setenv("CRASHDRILL_DATABASE_URL", postgres_url)
    assert serve_cli.main(["--data-dir", str(tmp_path), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "has schema version 99, but this crashdrill knows versions up to" in err, err
    assert "postgresql://crashdrill:***@127.0.0.1:" in err
    assert postgres_server.password not in err and "Traceback" not in err
    # The data dir's lock went with the failed start.
    monkeypatch.delenv("CRASHDRILL_DATABASE_URL")
    create_app(Settings(data_dir=tmp_path)).state.lab.db.close()


def test_doctor_says_why_it_cannot_connect(postgres_server: PostgresServer) -> None:
    url = postgres_server.url().replace(postgres_server.password, SECRET)
    proc = run_cli("doctor", "postgres", env={"CRASHDRILL_DATABASE_URL": url})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  connect" in proc.stdout and "password authentication failed" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_doctor_refuses_a_url_of_another_kind_with_exit_2() -> None:
    proc = run_cli("doctor", "postgres", f"mysql://lab:{SECRET}@db.example.com/lab")
    assert proc.returncode == 2 and "postgresql:// or postgres://" in proc.stderr
    assert SECRET not in proc.stderr


def test_without_postgres_the_tests_skip_except_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL"):
        unavailable("no PostgreSQL binaries")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        unavailable("no PostgreSQL binaries")
