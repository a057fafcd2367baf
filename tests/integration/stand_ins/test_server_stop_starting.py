"""A Stop that lands while the scheduler is starting a run (state "starting", its
supervisor not registered yet) stops it once it is, instead of a 409."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from crashdrill.server import lab as lab_module
from tests.support.lab import finished, stand_in_app, stand_in_settings, start_pair, wait_pair


class SlowToBuild(lab_module.Supervisor):
    """A supervisor that takes a while to build: the run sits in "starting" meanwhile."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(1.5)
        super().__init__(*args, **kwargs)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = stand_in_settings(
        tmp_path / "lab", monkeypatch, steps=60, token="stop-while-starting-token"
    )
    monkeypatch.setattr(lab_module, "Supervisor", SlowToBuild)
    with TestClient(stand_in_app(settings)) as c:
        yield c


def test_a_stop_while_the_run_is_starting_stops_it_once_started(client: TestClient) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    wait_pair(client, created["pair"], lambda rs: rs[0]["state"] == "starting", timeout=10)
    r = client.post(f"/api/runs/{run_a}/stop")
    assert r.status_code == 202, r.text
    runs = wait_pair(client, created["pair"], finished, timeout=60)
    assert runs[0]["state"] == "stopped", runs[0]
