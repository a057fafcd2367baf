"""The server as a subprocess on a free port, killed with SIGKILL mid-run and started
again: the live trainer is adopted, the one that died meanwhile is resumed, ingest goes on
from its offset, no record is lost and both runs finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.trainer.checkpoint_pause import format_pause
from tests.support.lab import free_port, spawn_server, wait_for_pair

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class Server:
    def __init__(self, data_dir: Path, port: int, log: Path) -> None:
        env = {
            **os.environ,
            "CRASHDRILL_DATA_DIR": str(data_dir),
            "CRASHDRILL_TELEMETRY": "0",
            # Both runs (ckpt_every 50 and 150) pause 8 s inside their checkpoint write
            # at step 150: a window in which the server is down and the trainers alive.
            PAUSE_ENV: format_pause(150, 8),
        }
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = spawn_server(port, env, log)


def file_records(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer's records, then the checkpoint mirror's (both files are ingested)."""
    out = []
    for name in ("records.jsonl", "mirror.jsonl"):
        path = run_dir / name
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_a_server_killed_mid_run_loses_nothing_and_the_runs_finish(tmp_path: Path) -> None:
    data_dir, port, log = tmp_path / "lab", free_port(), tmp_path / "server.log"
    server = Server(data_dir, port, log)
    cookies: dict[str, str] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            created = client.post("/api/pairs", json={"preset": "quick"}).json()
            cookies = dict(client.cookies)
            pair = created["pair"]
            run_a, run_b = (r["id"] for r in created["runs"])
            runs = wait_for_pair(
                client, pair, lambda rs: all((r["step"] or 0) >= 150 for r in rs), "the pauses"
            )
            assert [r["state"] for r in runs] == ["running", "running"]
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        # While the server is down: B's trainer dies too (nobody watches it).
        pid_b = json.loads((data_dir / "runs" / run_b / "run.json").read_text())["pid"]
        os.kill(pid_b, signal.SIGKILL)
        pid_a = json.loads((data_dir / "runs" / run_a / "run.json").read_text())["pid"]
        os.kill(pid_a, 0)  # A is still alive, paused inside its checkpoint write

        server = Server(data_dir, port, log)
        with httpx.Client(base_url=server.url, timeout=30, cookies=cookies) as client:
            runs = client.get(f"/api/pairs/{pair}").json()["runs"]
            assert runs[0]["state"] == "running" and runs[0]["segment"] == 0  # adopted
            runs = wait_for_pair(
                client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
            )
            assert [(r["segment"], r["step"]) for r in runs] == [(0, 300), (1, 300)]

            for run in (run_a, run_b):
                stored = client.get(f"/api/runs/{run}/records", params={"limit": 20000}).json()
                in_file = file_records(data_dir / "runs" / run)
                key = ("kind", "segment", "step", "t")
                only_db = Counter(tuple(r.get(k) for k in key) for r in stored["records"])
                only_db.subtract(Counter(tuple(r.get(k) for k in key) for r in in_file))
                assert {k: n for k, n in only_db.items() if n} == {}
                # The two files are ingested side by side, so compare as multisets.
                assert sorted(r["t"] for r in stored["records"]) == sorted(r["t"] for r in in_file)
                steps = {
                    r["step"]
                    for r in stored["records"]
                    if r["kind"] == "step" and r["segment"] == 0
                }
                if run == run_a:
                    assert steps == set(range(1, 301)), "A lost steps"
            events = client.get(f"/api/runs/{run_b}/events").json()["events"]
            texts = [e["text"] for e in events]
            lost = next(t for t in texts if t.startswith("The trainer stopped while"))
            assert "lab server was down" in lost
            assert texts.index(lost) < texts.index(next(t for t in texts if "Resumed at" in t))
            [check] = client.get(f"/api/runs/{run_b}/resume-checks").json()["checks"]
            assert check["bit_identical"] is True and check["complete"]
            # The owner's cookie is still the owner's after the restart (same signing key).
            assert client.post(f"/api/runs/{run_b}/crash").status_code == 409
            assert client.get(f"/api/pairs/{pair}").json()["owner"] is True
    finally:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
