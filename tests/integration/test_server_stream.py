"""The SSE stream on a real socket: a client that stops reading is not queued for; when
it reads again it gets the newest records and a gap to refetch, not the whole backlog."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crashdrill.server.settings import Settings
from tests.support.lab import STAND_IN, free_port, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def base_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "30000")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.0001")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "100000")
    settings = Settings(
        data_dir=tmp_path / "lab",
        port=free_port(),
        trainer_command=STAND_IN,
        stop_runs_on_exit=True,
        telemetry=False,
        stream_max_pending_records=100,
    )
    with serving(settings) as url:
        yield url


def test_a_client_that_stops_reading_gets_latest_values_and_a_gap(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as api:
        created = api.post("/api/pairs", json={"preset": "quick"}).json()
        pair = created["pair"]
        port = int(base_url.rsplit(":", 1)[1])
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        slow.sendall(
            f"GET /api/stream?pair={pair} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        )
        deadline = time.monotonic() + 90
        # The slow client reads nothing while 60000 records (~12 MB) go by: more than
        # the kernel's socket buffers on both ends hold.
        while True:
            runs = api.get(f"/api/pairs/{pair}").json()["runs"]
            if all(r["state"] == "finished" for r in runs):
                break
            assert time.monotonic() < deadline, runs
            time.sleep(0.2)
        stored = 0
        for run in runs:
            after = 0
            while page := api.get(
                f"/api/runs/{run['id']}/records", params={"after": after, "limit": 20000}
            ).json()["records"]:
                stored += len(page)
                after = page[-1]["id"]
    slow.settimeout(2.0)
    data = b""
    try:
        while chunk := slow.recv(1 << 20):
            data += chunk
    except TimeoutError:
        pass
    slow.close()
    frames = [f for f in data.split(b"\n\n") if b"event: records" in f]
    got = [
        json.loads(line[6:])
        for f in frames
        for line in f.split(b"\n")
        if line.startswith(b"data: ")
    ]
    received = sum(len(d["records"]) for d in got)
    assert stored > 60000
    assert any(d["gap"] for d in got), "the slow client was never told it missed records"
    assert received < stored / 2, "the server queued the whole backlog for a stalled client"
    for run in runs:
        steps = [
            r["step"]
            for d in got
            if d["run"] == run["id"]
            for r in d["records"]
            if r["kind"] == "step"
        ]
        assert max(steps) == 30000, "the newest records did not arrive"
