"""Shared pieces of the server tests: a free loopback port, the stand-in trainer's
command and the settings and app of an in-process lab that runs it (telemetry from a
FakeSampler), the real app served by uvicorn in a thread (and a client of it) or
`crashdrill serve` as a subprocess, and starting a pair and waiting for its runs to reach
a state."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from starlette.datastructures import State

    from crashdrill.server.settings import Settings

STAND_IN = (sys.executable, str(Path(__file__).resolve().parent / "stand_in_trainer.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(settings: Settings, start_timeout: float = 30) -> Iterator[str]:
    """`create_app(settings)` on 127.0.0.1:settings.port until the block ends."""
    import uvicorn

    from crashdrill.server.app import create_app

    port = settings.port
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        proxy_headers=False,  # as `crashdrill serve`: the lab judges forwarded headers
    )
    config.timeout_graceful_shutdown = 2
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        if thread.is_alive():  # said, not raised: the test's own outcome stands
            warnings.warn(f"the lab on port {port} did not stop within 30 s", stacklevel=2)


@contextmanager
def lab_client(data_dir: Path) -> Iterator[httpx.Client]:
    """A client of the lab on `data_dir` with the real trainer (two runs at a time, no
    telemetry), served on a free port until the block ends."""
    from crashdrill.server.settings import Settings

    settings = Settings(
        data_dir=data_dir,
        port=free_port(),
        max_concurrent=2,
        stop_runs_on_exit=True,
        telemetry=False,
    )
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def spawn_server(
    port: int, env: Mapping[str, str], log: Path, *args: str, start_timeout: float = 60
) -> subprocess.Popen[bytes]:
    """`python -m crashdrill.server --port PORT ARGS…` with its output appended to `log`,
    returned once it answers; killed, and the test failed with its log, if it does not."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "crashdrill.server", "--port", str(port), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/presets", timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("no server:\n" + log.read_text()) from None
            time.sleep(0.1)


def stop_server(proc: subprocess.Popen[bytes], wait_s: float = 30) -> None:
    """Stop a `spawn_server` server as Ctrl-C does (SIGINT); SIGKILL past `wait_s`."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_pair(
    client: httpx.Client | TestClient,
    pair: str,
    ok: Callable[[list[dict[str, Any]]], bool],
    what: str,
    timeout_s: float = 150,
    poll_s: float = 0.05,
) -> list[dict[str, Any]]:
    """The pair's runs once `ok(runs)` holds; fails naming `what` and each run's state,
    stage, segment and step when that takes over `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs: list[dict[str, Any]] = client.get(f"/api/pairs/{pair}").json()["runs"]
        if ok(runs):
            return runs
        states = [(r["state"], r["stage"], r["segment"], r["step"]) for r in runs]
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {states}"
        time.sleep(poll_s)


def wait_pair(
    client: TestClient,
    pair: str,
    ok: Callable[[list[dict[str, Any]]], bool],
    timeout: float = 30,
) -> list[dict[str, Any]]:
    """`wait_for_pair` for the in-process tests (Starlette's TestClient): a bound
    of 30 s, under their 90 s pytest timeout, so a hang fails with the runs' states rather
    than a stack dump."""
    return wait_for_pair(client, pair, ok, "the pair's runs", timeout_s=timeout)


def finished(runs: list[dict[str, Any]]) -> bool:
    """Every run of the pair has ended, however it ended."""
    return all(r["state"] in ("finished", "failed", "stopped") for r in runs)


def start_pair(client: TestClient) -> dict[str, Any]:
    """A pair of the quick lesson, asked for as a student; the 201 answer's body."""
    r = client.post("/api/pairs", json={"preset": "quick"})
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


def as_stranger(client: TestClient, fn: Callable[[], Any]) -> Any:
    """`fn()` with the client's cookies put aside: what someone else's browser gets."""
    saved = dict(client.cookies)
    client.cookies.clear()
    try:
        return fn()
    finally:
        client.cookies.clear()
        client.cookies.update(saved)


CRASH_TRIES = 3


def _crashable_past(runs: list[dict[str, Any]], index: int, step: int) -> bool:
    """Run `index` may be crash-tested and has trained past `step`."""
    return bool(runs[index]["can_crash"]) and (runs[index]["step"] or 0) >= step


def crash_costing_steps(
    client: httpx.Client, pair: str, index: int, after_step: int, timeout_s: float = 150
) -> tuple[str, int]:
    """Crash test on run `index` of `pair` once it trains past `after_step`, until a kill
    costs steps to recompute: one that lands just after a checkpoint (a loaded machine
    can delay it that long) costs none and makes no comparison, so another follows 30
    steps later. Returns the run's id and the segment whose resume check compares."""
    for _ in range(CRASH_TRIES):
        runs = wait_for_pair(
            client,
            pair,
            partial(_crashable_past, index=index, step=after_step),
            f"run {index} training past step {after_step}",
            timeout_s,
        )
        run_id, segment = runs[index]["id"], (runs[index]["segment"] or 0) + 1
        crashed = client.post(f"/api/runs/{run_id}/crash")
        assert crashed.status_code == 202, crashed.text
        deadline = time.monotonic() + timeout_s
        while True:
            checks = client.get(f"/api/runs/{run_id}/resume-checks").json()["checks"]
            check = next((c for c in checks if c["segment"] == segment), None)
            if check is not None:
                break
            assert time.monotonic() < deadline, f"no resume check of segment {segment}"
            time.sleep(0.1)
        if check["expected_points"] > 0:
            return run_id, segment
        after_step = int(client.get(f"/api/pairs/{pair}").json()["runs"][index]["step"] or 0)
        after_step += 30
    raise AssertionError(f"{CRASH_TRIES} crash tests in a row cost no step to recompute")


def stand_in_settings(
    data_dir: Path,
    monkeypatch: Any,
    *,
    steps: int,
    token: str | None = None,
    **changes: Any,
) -> Settings:
    """Settings of an in-process lab whose runs are the stand-in trainer (`steps` steps of
    20 ms each), two at a time, stopped with the lab; `changes`: other settings."""
    from crashdrill.server.settings import Settings

    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", str(steps))
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    fields: dict[str, Any] = {
        "data_dir": data_dir,
        "trainer_command": STAND_IN,
        "max_concurrent": 2,
        "stop_runs_on_exit": True,
        "instructor_token": token,
    }
    return Settings(**{**fields, **changes})


class FakeSample:
    def to_record(self) -> dict[str, Any]:
        return {"t": time.time(), "cpu_pct": 12.5, "gpu_state": "no_gpu"}


class FakeSampler:
    """The machine telemetry of an in-process lab: one fixed sample, no psutil or NVML."""

    def __init__(self, _settings: object) -> None:
        self.stopped = False

    def start(self, callback: Callable[[Any], None], interval_s: float = 2.0) -> None:
        callback(FakeSample())

    def stop(self) -> None:
        self.stopped = True


def app_state(client: TestClient) -> State:
    """The state of the lab's app behind an in-process client (`.lab`, `.settings`):
    TestClient types its app as any ASGI app, and this one is always create_app's."""
    return cast("FastAPI", client.app).state


def stand_in_app(settings: Settings, **changes: Any) -> FastAPI:
    """The lab's app on `settings` (with `changes`), its telemetry a FakeSampler."""
    import dataclasses

    from crashdrill.server.app import create_app

    return create_app(dataclasses.replace(settings, **changes), sampler_factory=FakeSampler)
