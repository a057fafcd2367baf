"""`crashdrill serve` as a subprocess on a real Postgres (tests/support/postgres.py) with
the real trainer: a `quick` pair, a crash test, a bit-identical resume check, every record
in the database, and the password nowhere in the server's output."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashdrill.server.storage.db import PostgresDatabase
from tests.support.lab import free_port, serving, spawn_server, stand_in_settings, wait_for_pair
from tests.support.latency_proxy import LatencyProxy
from tests.support.postgres import PostgresServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def is_step(line: str) -> bool:
    try:
        return bool(json.loads(line).get("kind") == "step")
    except (ValueError, AttributeError):
        return False


def test_a_quick_pair_on_postgres_resumes_bit_identically(
    tmp_path: Path, postgres_server: PostgresServer, postgres_url: str
) -> None:
    port, log = free_port(), tmp_path / "server.log"
    env = {
        **os.environ,
        "CRASHDRILL_DATA_DIR": str(tmp_path / "lab"),
        "CRASHDRILL_DATABASE_URL": postgres_url,
        "CRASHDRILL_TELEMETRY": "0",
    }
    proc = spawn_server(port, env, log, "--log-level", "debug")
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            created = client.post("/api/pairs", json={"preset": "quick"}).json()
            pair, run_a = created["pair"], created["runs"][0]["id"]
            wait_for_pair(
                client,
                pair,
                lambda rs: rs[0]["can_crash"] and (rs[0]["step"] or 0) >= 60,
                "A to pass its checkpoint at 50",
            )
            assert client.post(f"/api/runs/{run_a}/crash").status_code == 202
            runs = wait_for_pair(
                client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
            )
            assert [(r["crashes"], r["step"]) for r in runs] == [(1, 300), (0, 300)]
            [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
            assert check["bit_identical"] is True and check["max_abs_delta"] == 0.0, check
            # From the newest checkpoint before the kill (50 or later: quick is fast).
            hi = check["steps"][1]
            start = check["from_step"]
            assert check["complete"] and start % 50 == 0 and 50 <= start < hi <= start + 50, check
            params: dict[str, Any] = {"kind": "step", "limit": 20000}
            served = client.get(f"/api/runs/{run_a}/records", params=params).json()["records"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    db = PostgresDatabase(postgres_url)
    sql = "SELECT COUNT(*) AS n FROM records WHERE run_id = ? AND kind = 'step'"
    stored = db.one(sql, (run_a,))
    db.close()
    lines = (tmp_path / "lab" / "runs" / run_a / "records.jsonl").read_text().splitlines()
    written = sum(1 for line in lines if is_step(line))
    assert stored == {"n": len(served)} and len(served) == written == 300 + check["points"]
    output = log.read_text()
    assert "database: Postgres at postgresql://crashdrill:***@127.0.0.1:" in output, output
    assert postgres_server.password not in output


def test_two_labs_on_one_database_leave_each_other_s_runs_alone(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lab B starts on the database while lab A's pair trains: B adopts and resumes none
    of A's runs, A's two active runs do not count against B's limit of two, and B
    stopping its own runs on exit leaves A's training."""
    settings = {
        name: dataclasses.replace(
            stand_in_settings(tmp_path / name, monkeypatch, steps=500),
            port=free_port(),
            database_url=postgres_url,
            telemetry=False,
        )
        for name in "ab"
    }
    with serving(settings["a"]) as url_a, httpx.Client(base_url=url_a, timeout=30) as a:
        pair_a = a.post("/api/pairs", json={"preset": "quick"}).json()["pair"]
        wait_for_pair(a, pair_a, lambda rs: all(r["state"] == "running" for r in rs), "A runs")
        with serving(settings["b"]) as url_b, httpx.Client(base_url=url_b, timeout=30) as b:
            pair_b = b.post("/api/pairs", json={"preset": "quick"}).json()["pair"]
            runs_b = wait_for_pair(
                b, pair_b, lambda rs: all(r["state"] != "queued" for r in rs), "B to start", 20
            )
            assert {r["state"] for r in runs_b} <= {"starting", "running"}, runs_b
        # B stopped its runs on exit; A's kept training, never crashed nor resumed.
        runs_a = wait_for_pair(
            a, pair_a, lambda rs: all(r["state"] == "finished" for r in rs), "A to finish"
        )
        assert [(r["crashes"], r["segment"], r["step"]) for r in runs_a] == [(0, 0, 500)] * 2
        assert {r["state"] for r in a.get(f"/api/pairs/{pair_b}").json()["runs"]} == {"stopped"}
    labs = {name: (tmp_path / name / "lab_id").read_text().strip() for name in "ab"}
    db = PostgresDatabase(postgres_url)
    rows = db.run("SELECT pair_id, lab FROM runs")
    db.close()
    assert sorted((r["pair_id"], r["lab"]) for r in rows) == sorted(
        [(pair_a, labs["a"])] * 2 + [(pair_b, labs["b"])] * 2
    )


def test_a_database_outage_loses_nothing_and_is_said_once(
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database goes away while a pair trains (its connections cut, new ones refused)
    and both runs end during the outage: the API answers 503, the log says so once and
    once that it is back, and afterwards every record is stored and both runs finished."""
    caplog.set_level(logging.INFO, logger="crashdrill")
    pg_port = int(postgres_url.rsplit(":", 1)[1].split("/")[0])
    listen = free_port()
    settings = dataclasses.replace(
        stand_in_settings(tmp_path / "lab", monkeypatch, steps=150),
        port=free_port(),
        database_url=postgres_url.replace(f":{pg_port}/", f":{listen}/"),
        telemetry=False,
    )
    proxy = LatencyProxy(pg_port, listen_port=listen).start()
    try:
        with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as api:
            pair = api.post("/api/pairs", json={"preset": "quick"}).json()["pair"]
            wait_for_pair(api, pair, lambda rs: all((r["step"] or 0) >= 20 for r in rs), "20")
            proxy.stop()  # the database is gone
            run_dirs = sorted((tmp_path / "lab" / "runs").iterdir())
            deadline = time.monotonic() + 30
            while not all(_ended(d) for d in run_dirs):  # both trainers end meanwhile
                assert time.monotonic() < deadline, "the stand-in trainers did not end"
                time.sleep(0.2)
            r = api.get(f"/api/pairs/{pair}")
            assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
            assert "database is unreachable" in r.json()["detail"]
            proxy = LatencyProxy(pg_port, listen_port=listen).start()  # it is back
            runs = wait_for_pair(
                api,
                pair,
                lambda rs: all(r["state"] == "finished" and r["step"] == 150 for r in rs),
                "the end, every record ingested",
                60,
            )
            assert [(r["step"], r["crashes"]) for r in runs] == [(150, 0)] * 2
            for run in runs:
                params: dict[str, Any] = {"kind": "step", "limit": 20000}
                got = api.get(f"/api/runs/{run['id']}/records", params=params).json()
                assert [rec["step"] for rec in got["records"]] == list(range(1, 151))
    finally:
        proxy.stop()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("crash")]
    down = [m for level, m in said if "database is unreachable" in m]
    back = [m for level, m in said if "database is reachable again" in m]
    assert len(down) == 1 and len(back) == 1, said
    assert not [m for level, m in said if level >= logging.ERROR], said
    assert "***" in down[0] or "refused" in down[0] or "lost" in down[0]


def _ended(run_dir: Path) -> bool:
    """The stand-in trainer wrote its last stage."""
    records = run_dir / "records.jsonl"
    return records.exists() and '"stage":"finished"' in records.read_text()
