"""POST /api/runs/{run}/preempt in-process, runs played by the stand-in trainer: the
Preempt button's SIGTERM, a resume that says what the stop cost, and who may press it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.lab import (
    as_stranger,
    finished,
    stand_in_app,
    stand_in_settings,
    start_pair,
    wait_pair,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("CRASHDRILL_STANDIN_GRACEFUL", "1")
    settings = stand_in_settings(tmp_path / "lab", monkeypatch, steps=60)
    with TestClient(stand_in_app(settings)) as c:
        yield c


def test_preempt_sigterms_the_trainer_and_its_resume_says_the_stop_cost_nothing(
    client: TestClient,
) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    wait_pair(client, created["pair"], lambda rs: (rs[0]["step"] or 0) >= 25 and rs[0]["can_crash"])
    r = client.post(f"/api/runs/{run_a}/preempt")
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["grace_s"] == 30.0 and body["state"] == "running" and body["signalled_pid"] > 0
    runs = wait_pair(client, created["pair"], finished)
    assert runs[0]["state"] == "finished" and runs[0]["segment"] == 1
    events = client.get(f"/api/runs/{run_a}/events").json()["events"]
    texts = [e["text"] for e in events]
    (said,) = [t for t in texts if t.startswith("Preempted: SIGTERM with a 30s grace")]
    assert (
        said.endswith("the last step it trained.")
        and "The stop lost nothing: it saved step" in said
    )
    assert client.post(f"/api/runs/{run_a}/preempt").status_code == 409  # finished now


def test_only_the_owner_may_preempt_and_only_a_training_run(client: TestClient) -> None:
    created = start_pair(client)
    run_a = created["runs"][0]["id"]
    r = as_stranger(client, lambda: client.post(f"/api/runs/{run_a}/preempt"))
    assert r.status_code == 403
    wait_pair(client, created["pair"], finished)
    r = client.post(f"/api/runs/{run_a}/preempt")
    detail = r.json()["detail"]
    assert r.status_code == 409 and detail.startswith("Run A has finished: a preemption hits")
    assert run_a not in detail, "a student reads the run's label, not its internal id"
