"""The page's reading of a prediction (web/static/predict.js), run in node on questions as
a lesson's public view sends them (trainer/prediction.py's to_dict)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.prediction import Prediction

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


def test_a_choice_reads_as_the_lesson_s_words_and_is_right_only_when_equal() -> None:
    q = Prediction("What will each run do?", "resume").to_dict()
    assert page("answerText", q, "fresh") == "starts over from step 0"
    assert page("answerRight", q, "fresh", "fresh") is True
    assert page("answerRight", q, "fresh", "refused") is False
    assert page("answerRight", q, "fresh", None) is None  # not measured yet


def test_a_number_of_steps_is_right_within_ten_percent() -> None:
    q = Prediction("How many steps?", "lost_steps").to_dict()
    assert page("answerText", q, 1) == "1 step" and page("answerText", q, 1000) == "1,000 steps"
    assert page("answerRight", q, 95, 100) is True
    assert page("answerRight", q, 85, 100) is False
    assert page("answerRight", q, 1, 0) is True  # at least one step of slack
    assert page("answerRight", q, None, 10) is None  # skipped
