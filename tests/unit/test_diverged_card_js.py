"""What the page says of a run that diverged (issue #24, item 2): its own state with the
trainer's sentence and the settings the student changed, no Crash test, and a NaN step
(null in every answer) that neither throws nor draws — run in node on records and views
shaped as the stream sends them (web/static/cards.js, model.js)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")

SENTENCE = "Diverged at step 9: the gradient norm is inf. Training stopped there."


def run_js(overrides: Any, view_state: str = "diverged") -> Any:
    """studentState and crashBlocker of a diverged run whose pair's preset view carries
    `overrides` (the student's changes to the lesson); `view_state`: the supervisor's state
    in the run view ("running" until its report of the exit arrives)."""
    model, cards = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "cards.js"))
    code = f"""
        Promise.all([import({model}), import({cards})]).then(([m, c]) => {{
            const run = new m.RunModel({{id: "r", label: "A", state: "running", stage: "train",
                segment: 0, crashes: 0, step: 8, can_crash: true}},
                new Set(["step", "val", "probe", "sample", "ckpt"]));
            run.add([
                {{kind: "step", segment: 0, step: 8, loss: 2.5, t: 8}},
                {{kind: "step", segment: 0, step: 9, loss: null, loss_bits: 2143289344,
                  grad_norm: null, t: 9}},
                {{kind: "event", segment: 0, code: "diverged", level: "error", step: 9,
                  text: {json.dumps(SENTENCE)}, t: 9}},
            ]);
            run.setView({{state: {json.dumps(view_state)}, stage: "diverged", step: 9, exit_code: 4,
                message: {json.dumps(SENTENCE)}, can_crash: false}});
            const out = [c.studentState(run, null, {{overrides: {json.dumps(overrides)}}}),
                         c.crashBlocker(run, true)];
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_diverged_run_says_what_diverged_and_which_settings_the_student_changed() -> None:
    (state, line), blocked = run_js({"lr": 1, "warmup": 0})
    assert state == "diverged"
    assert line == f"{SENTENCE} Settings changed from the lesson: lr = 1, warmup = 0."
    assert blocked == "Diverged: there is no training process left to kill."


def test_a_run_that_diverged_with_the_lesson_s_own_settings_says_so() -> None:
    (state, line), _ = run_js({})
    assert state == "diverged" and line.endswith("It diverged with the lesson's own settings.")


def test_a_diverged_stage_is_said_before_the_supervisor_reports_the_exit() -> None:
    # The trainer's "diverged" stage record comes before the supervisor's state: the card
    # says diverged at once, never "Preparing" or "starting" (a stage after training).
    (state, line), blocked = run_js({"lr": 1}, view_state="running")
    assert state == "diverged"
    assert line.endswith("Settings changed from the lesson: lr = 1."), line
    assert blocked == "Diverged: there is no training process left to kill."
