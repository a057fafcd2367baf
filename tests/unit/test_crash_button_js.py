"""When the page lets a student press Crash test (web/static/cards.js `crashBlocker`, over
web/static/model.js's RunModel), and what the card says while a start is pending or the
run is queued — run in node on records and views shaped as the stream sends them."""

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

KEYED = ["step", "val", "probe", "sample", "ckpt"]


def run_js(steps: str) -> Any:
    """Run `steps` (JS statements that push onto `out`) with `run` a RunModel of a
    running pair and `blocked()` / `state(starts)` the card's answers for it."""
    model, cards = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "cards.js"))
    code = f"""
        Promise.all([import({model}), import({cards})]).then(([m, c]) => {{
            const run = new m.RunModel({{id: "r", label: "A", state: "starting",
                stage: "starting", segment: 0, crashes: 0, step: null, can_crash: false}},
                new Set({json.dumps(KEYED)}));
            const blocked = () => c.crashBlocker(run, true);
            const state = (starts) => c.studentState(run, starts);
            const step = (segment, n) => ({{kind: "step", segment, step: n, loss: 1, t: n}});
            const view = (v) => run.setView(v);
            const out = [];
            {steps}
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_crash_test_is_enabled_by_the_first_step_record_before_the_view_says_so() -> None:
    out = run_js("""
        out.push(blocked());
        run.add([{kind: "stage", segment: 0, stage: "train", t: 1}]);
        out.push(blocked());
        run.add([step(0, 1)]);  // the view (throttled) still says starting, can_crash false
        out.push(blocked());
    """)
    assert out[0] == out[1] == "Not training yet: the trainer is starting."
    assert out[2] is None


def test_after_a_crash_test_stale_views_never_enable_it_until_the_restart_trains() -> None:
    out = run_js("""
        view({state: "running", stage: "train", can_crash: true});
        run.add([step(0, 1), step(0, 2)]);
        out.push(blocked());
        run.signalled = 0;  // the crash request succeeded (app.js)
        view({state: "restarting", stage: "restarting"});
        out.push(blocked());
        run.add([step(0, 3)]);  // a record the killed trainer wrote before the kill
        view({state: "running", stage: "train", can_crash: true, segment: 0});  // stale
        out.push(blocked());
        run.add([{kind: "event", segment: 0, code: "crash", resume_from: 0, t: 4},
                 {kind: "resume", segment: 1, from_step: 0, t: 5}]);
        out.push(blocked());
        run.add([step(1, 1)]);  // the restart's first step record
        out.push(blocked());
    """)
    assert out[0] is None
    assert out[1] == "Already crashed: it is restarting from its checkpoint."
    back = "Restarting from its checkpoint: Crash test comes back with its first step."
    assert out[2] == out[3] == back
    assert out[4] is None


def test_a_view_that_says_restarting_keeps_it_disabled_without_a_newer_step() -> None:
    out = run_js("""
        view({state: "running", stage: "train", can_crash: true});
        run.add([step(0, 1)]);
        view({state: "restarting", stage: "restarting", segment: 0});  // an OOM kill, say
        out.push(blocked());
        run.add([{kind: "event", segment: 0, code: "killed", resume_from: 0, t: 3}]);
        view({state: "running", stage: "build", segment: 1});
        out.push(blocked());
        run.add([step(1, 1)]);
        out.push(blocked());
    """)
    assert out[0] == "Already crashed: it is restarting from its checkpoint."
    assert out[1] == "Restarting from its checkpoint: Crash test comes back with its first step."
    assert out[2] is None


def test_a_pending_start_says_how_long_starts_take_here_and_nothing_without_a_figure() -> None:
    out = run_js("""
        out.push(state(null), state({median_s: null, count: 0}), state({median_s: 0.41, count: 7}));
        run.add([step(0, 1)]);
        view({state: "running", stage: "train"});
        out.push(state({median_s: 0.41, count: 7}));
        run.signalled = 0;
        view({state: "restarting", stage: "restarting"});
        out.push(state({median_s: 2.3, count: 7}));
    """)
    assert out[0] == out[1] == ["starting", "Starting the trainer process."]
    assert out[2] == ["starting", "Starting the trainer: starts take about 0.4 s on this lab."]
    assert out[3] == ["training", "Training."]
    assert out[4] == [
        "crashed",
        "Killed with SIGKILL (no chance to save). Restarting from its newest complete"
        " checkpoint. Starts take about 2.3 s on this lab.",
    ]


def test_a_queued_run_is_told_its_place_and_the_server_s_estimate() -> None:
    out = run_js("""
        view({state: "queued", stage: "queued", queue_position: 3, queue_wait_s: 40.2});
        out.push(state(null)[1]);
        view({queue_position: 1, queue_wait_s: null});
        out.push(state(null)[1]);
        out.push(blocked());
    """)
    assert out[0] == "Waiting for a free slot: number 3 in the queue, about 40 s."
    assert out[1] == "Waiting for a free slot: number 1 in the queue."
    assert out[2] == "Not started yet: it is waiting in the queue."
