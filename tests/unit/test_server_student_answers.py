"""What a student's browser is told about runs that failed or diverged (issue #24, item 2),
against the real app in-process with the stand-in trainer: every answer is valid JSON (a
NaN loss is null, its bits kept), a divergence is its own state with the trainer's
sentence and the pair's changed settings, and no answer a student can read holds a
server path or a traceback; the instructor's class view has the failure's error output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from crashdrill.server.settings import Settings
from crashdrill.server.views import record_json, run_view
from crashdrill.trainer.record_contract import float32_bits
from tests.support.lab import stand_in_app, stand_in_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

TOKEN = "teach-me-what-students-may-read"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
REPO = str(Path(__file__).resolve().parents[2])
LEAKS = ("Traceback", 'File "', REPO)


def strict_json(text: str) -> Any:
    """JSON as a browser reads it: no NaN, no Infinity."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in an answer: not JSON a browser can read")

    return json.loads(text, parse_constant=refuse)


def student_answers(client: TestClient, pair: str) -> list[str]:
    """Every answer a student's page reads of a pair: the pair, each run's records,
    events and resume checks, and the stream's hello and backfill."""
    texts = [client.get(f"/api/pairs/{pair}").text]
    for run in strict_json(texts[0])["runs"]:
        for what in ("records", "events", "resume-checks"):
            r = client.get(f"/api/runs/{run['id']}/{what}")
            assert r.status_code == 200, r.text
            texts.append(r.text)
    with client.stream(
        "GET", "/api/stream", params={"pair": pair}, headers={"Last-Event-ID": "0"}
    ) as events:
        data = []
        for line in events.iter_lines():
            if line.startswith("data: "):
                data.append(line[len("data: ") :])
            if len(data) == 2:  # hello, then the backfill of both runs' records
                break
    texts += data
    for text in texts:
        strict_json(text)
    return texts


def test_a_nan_stored_before_ingest_made_it_null_is_served_as_null() -> None:
    old = '{"v":1,"kind":"step","step":9,"loss":NaN,"grad_norm":Infinity,"text":"NaN"}'
    served = strict_json(record_json(7, "r1", old))
    assert served == {
        "id": 7,
        "run": "r1",
        "v": 1,
        "kind": "step",
        "step": 9,
        "loss": None,
        "grad_norm": None,
        "text": "NaN",  # a string stays as it was
    }
    row: dict[str, Any] = {"id": "r1", "label": "A", "state": "failed", "stage": "failed"}
    row |= {"stage_progress": 1.0, "step": 9, "segment": 0, "crashes": 0, "message": None}
    row |= {"exit_code": 1, "latest_json": '{"step":' + old + "}"}
    pair = {"preset_json": '{"run": {"steps": 20}}'}
    view = run_view(row, pair, {})
    assert strict_json(json.dumps(view, allow_nan=False))["latest"]["step"]["loss"] is None


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return stand_in_settings(tmp_path / "lab", monkeypatch, steps=40, token=TOKEN, max_concurrent=4)


def ended(client: TestClient, pair: str, state: str) -> bool:
    runs = client.get(f"/api/pairs/{pair}").json()["runs"]
    return all(r["state"] == state for r in runs)


def test_a_run_that_diverges_is_diverged_with_valid_json_and_its_changed_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_DIVERGE_AT", "11")
    app = stand_in_app(settings)
    with TestClient(app) as student:
        body = {"preset": "lesson-1.7-fast", "overrides": {"steps": 80, "seed": 3}}
        r = student.post("/api/pairs", json=body)
        assert r.status_code == 201, r.text
        pair = r.json()["pair"]
        wait_until(lambda: ended(student, pair, "diverged"), "both runs to diverge", 60)
        answers = student_answers(student, pair)
        view = strict_json(answers[0])
        assert view["preset"]["overrides"] == {"steps": 80, "seed": 3}  # the page names them
        for run in view["runs"]:
            assert run["stage"] == "diverged" and run["exit_code"] == 4
            assert run["message"] == "Diverged at step 11: the loss is nan."
            assert "detail" not in run
            records = student.get(f"/api/runs/{run['id']}/records", params={"kind": "step"})
            nan_step = [x for x in records.json()["records"] if x["step"] == 11]
            assert nan_step[0]["loss"] is None and nan_step[0]["grad_norm"] is None
            assert nan_step[0]["loss_bits"] == float32_bits(float("nan"))
            events = student.get(f"/api/runs/{run['id']}/events").json()["events"]
            assert [e["code"] for e in events if e["level"] == "error"] == ["diverged"]
        for text in answers:
            for leak in LEAKS:
                assert leak not in text, (leak, text[:2000])


def test_a_failed_run_tells_students_how_it_ended_and_only_the_instructor_its_traceback(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_STANDIN_FAIL_AT", "7")
    app = stand_in_app(settings)
    with TestClient(app) as student:
        r = student.post("/api/pairs", json={"preset": "quick"})
        assert r.status_code == 201, r.text
        pair = r.json()["pair"]
        wait_until(lambda: ended(student, pair, "failed"), "both runs to fail", 60)
        answers = student_answers(student, pair)
        for run in strict_json(answers[0])["runs"]:
            assert run["message"].startswith("The trainer failed (exit status 1).")
        run_dir = str(settings.data_dir)
        for text in answers:
            for leak in (*LEAKS, run_dir, "stand-in failure"):
                assert leak not in text, (leak, text[:2000])
        teacher = TestClient(app)
        page = teacher.get("/api/instructor/class", headers=BEARER).json()
        details = [run["detail"] for p in page["pairs"] for run in p["runs"]]
        assert len(details) == 2
        assert all("Traceback" in d and "RuntimeError: stand-in failure" in d for d in details)
