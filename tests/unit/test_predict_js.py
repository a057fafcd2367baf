"""The page's reading of a prediction (web/static/predict.js), run in node on questions as
a lesson's public view sends them (trainer/prediction.py's to_dict)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.prediction import Prediction, ask_when

MODULE = Path(__file__).resolve().parents[2] / "web" / "static" / "predict.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")


def page(fn: str, *args: Any) -> Any:
    code = (
        f"import({json.dumps(MODULE.as_uri())}).then((m) => {{"
        f" console.log(JSON.stringify(m.{fn}(...{json.dumps(args)}))); }})"
    )
    assert NODE is not None
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_choice_reads_as_the_lesson_s_words() -> None:
    q = Prediction("What will each run do?", "resume").to_dict()
    assert page("answerText", q, "fresh") == "starts over from step 0"


def test_the_page_shows_the_server_s_verdict_by_the_one_rule_not_a_rule_of_its_own() -> None:
    q = Prediction("How many steps?", "lost_steps").to_dict()
    assert page("answerText", q, 1) == "1 step" and page("answerText", q, 1000) == "1,000 steps"
    # 25 against a measured 8: what the server judged, by trainer/prediction.py's rule
    for answer, measured in ((25, 8), (10, 8), (270, 300)):
        right = Prediction("?", "lost_steps").answer_right(answer, measured)
        result = {"status": "measured", "outcome": measured, "right": right}
        text, verdict, status = page("resultText", q, result, None)
        assert text == f"{measured} steps" and status == "measured"
        assert verdict == ("✓ as predicted" if right else "✗ not as predicted")


def test_a_run_that_ended_without_a_crash_test_says_there_is_nothing_to_compare() -> None:
    q = Prediction("How many steps?", "lost_steps").to_dict()
    why = "finished without a crash test: no outcome to compare"
    assert page(
        "resultText", q, {"status": "none", "outcome": None, "right": None, "why": why}, None
    ) == [
        why,
        "no outcome",
        "none",
    ]
    assert page("resultText", q, {"status": "waiting"}, None)[0] == "waiting for a crash test…"


def test_the_hold_note_names_the_runs_really_held_and_when_it_ends() -> None:
    both = page("holdText", ["A", "B"], "12:03:45", True)
    assert both.startswith("Both runs are held where they are") and "until 12:03:45" in both
    assert "your crash test is sent as soon as you answer" in both
    one = page("holdText", ["A"], "12:03:45", False)
    assert one.startswith("Run A is held where it is") and "Both" not in one
    assert "save or skip to let them go on" in one
    none = page("holdText", [], "12:03:45", False)
    assert "none is held" in none and "held where" not in none


def test_a_lesson_whose_crash_comes_by_itself_waits_for_the_wall_not_a_crash_test() -> None:
    q = {**Prediction("How many steps?", "lost_steps").to_dict(), "ask": ask_when(300)}
    assert page("resultText", q, {"status": "waiting"}, None)[0] == "waiting for the wall…"
