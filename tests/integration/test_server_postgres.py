"""`crashdrill serve` as a subprocess on a real Postgres (tests/support/postgres.py) with
the real trainer: a `quick` pair, a crash test, a bit-identical resume check, every record
in the database, and the password nowhere in the server's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashdrill.server.db import PostgresDatabase
from tests.support.lab import free_port, spawn_server, wait_for_pair
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
            assert check["complete"] and check["from_step"] == 50, check
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
