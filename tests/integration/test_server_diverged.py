"""Issue #24, item 2, end to end: a student starts lesson-1.7-fast with settings the lesson
allows (lr 1.0, weight_decay 10, warmup 0, grad_clip 1000) on a real lab with the real
trainer. Before, its loss turned NaN, the records API answered bare NaN (not JSON) and the
run failed at step 300 with a traceback holding the server's paths. Now both runs end
'diverged' at once, saving nothing after it, and every answer the page reads is JSON
without a traceback or a path of the server's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.lab import lab_client

pytestmark = pytest.mark.timeout(300)

DIVERGING = {"lr": 1.0, "weight_decay": 10.0, "warmup": 0, "grad_clip": 1000.0}
REPO = str(Path(__file__).resolve().parents[2])


def strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in an answer: not JSON a browser can read")

    return json.loads(text, parse_constant=refuse)


def test_settings_a_lesson_allows_that_diverge_end_the_runs_diverged_with_clean_answers(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "lab"
    with lab_client(data_dir) as c:
        body = {"preset": "lesson-1.7-fast", "overrides": DIVERGING}
        r = c.post("/api/pairs", json=body)
        assert r.status_code == 201, r.text
        pair = r.json()["pair"]
        deadline = time.monotonic() + 240
        while True:
            runs = c.get(f"/api/pairs/{pair}").json()["runs"]
            if all(x["state"] not in ("queued", "starting", "running", "restarting") for x in runs):
                break
            assert time.monotonic() < deadline, runs
            time.sleep(0.2)
        assert [x["state"] for x in runs] == ["diverged", "diverged"], runs
        answers = [c.get(f"/api/pairs/{pair}").text]
        for run in runs:
            assert run["exit_code"] == 4 and run["stage"] == "diverged"
            assert run["message"].startswith(f"Diverged at step {run['step']}: the ")
            for what in ("records?limit=5000", "events", "resume-checks"):
                answers.append(c.get(f"/api/runs/{run['id']}/{what}").text)
            records = strict_json(answers[-3])["records"]
            ckpts = [x["step"] for x in records if x["kind"] == "ckpt"]
            assert ckpts == [0], "nothing is saved after the divergence (ckpt_every 50)"
            assert (data_dir / "runs" / run["id"] / "ckpt" / "step-00000000").is_dir()
            steps = [x for x in records if x["kind"] == "step"]
            assert steps[-1]["step"] == run["step"] < 50
            assert steps[-1]["loss"] is None or steps[-1]["grad_norm"] is None
        assert strict_json(answers[0])["preset"]["overrides"] == DIVERGING
        for text in answers:
            strict_json(text)
            for leak in ("Traceback", 'File "', REPO, str(data_dir)):
                assert leak not in text, (leak, text[:2000])
