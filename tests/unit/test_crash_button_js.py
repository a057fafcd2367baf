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

from crashdrill.trainer.record_contract import contract_json

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")

KEYED = ["step", "val", "probe", "sample", "ckpt"]


def run_js(steps: str, contract: dict[str, Any] | None = None) -> Any:
    """Run `steps` (JS statements that push onto `out`) with `run` a RunModel of a
    running pair and `blocked()` / `state(starts)` the card's answers for it; `contract`
    stands for GET /api/record-kinds (default: the real one)."""
    model, cards = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "cards.js"))
    code = f"""
        Promise.all([import({model}), import({cards})]).then(([m, c]) => {{
            const contract = {json.dumps(contract or contract_json())};
            const run = new m.RunModel({{id: "r", label: "A", state: "starting",
                stage: "starting", segment: 0, crashes: 0, step: null, can_crash: false}},
                new Set({json.dumps(KEYED)}), m.eventCodes(contract));
            let preset = null;
            const blocked = (starts = null) => c.crashBlocker(run, true, starts, preset);
            const state = (starts) => c.studentState(run, starts, preset);
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
    assert out[2] == [
        "starting",
        "Starting the trainer: a start usually takes ≈ 0.4 s on this lab.",
    ]
    assert out[3] == ["training", "Training."]
    assert out[4] == [
        "crashed",
        "Killed with SIGKILL (no chance to save). Restarting. A start usually takes ≈ 2.3 s"
        " on this lab.",
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


def test_while_a_trainer_starts_the_blocked_button_says_how_long_starts_take_here() -> None:
    out = run_js("""
        out.push(blocked({median_s: 0.41, count: 7}));
        out.push(blocked({median_s: null, count: 0}));
    """)
    assert (
        out[0]
        == "Not training yet: the trainer is starting (a start usually takes ≈ 0.4 s on this lab)."
    )
    assert out[1] == "Not training yet: the trainer is starting."


def test_a_run_whose_trainer_finished_is_done_never_starting_or_resuming() -> None:
    # The trainer's `finished` stage record comes before the supervisor's report: the
    # view still says running (segment 1, after a resume that lost nothing).
    out = run_js("""
        view({state: "running", stage: "train", segment: 0, steps: 600});
        run.add([step(0, 1), step(0, 300)]);
        run.add([{kind: "event", segment: 0, code: "graceful_stop", resume_from: 300, t: 301},
                 {kind: "resume", segment: 1, from_step: 300, path: "ckpt/step-300", t: 302},
                 step(1, 301), step(1, 600)]);
        view({state: "running", stage: "train", segment: 1, step: 600});
        run.add([{kind: "stage", segment: 1, stage: "finished", t: 700}]);
        out.push(state(null), blocked());
        view({state: "running", stage: "finished", segment: 1, step: 600});
        out.push(state(null), blocked());
    """)
    for i in (0, 2):
        assert out[i] == ["done", "Finished 600 steps."]
    for i in (1, 3):
        assert out[i] == "Finished: there is no training process left to kill."


def test_a_graceful_stop_or_a_wall_is_preempted_never_crashed() -> None:
    out = run_js("""
        preset = {crash: {wall_step: 300}};
        view({state: "running", stage: "train", segment: 0});
        run.add([step(0, 1), step(0, 300)]);
        view({state: "running", stage: "restarting", segment: 0});  // the wall's SIGTERM
        out.push(state(null)[0], blocked());
        run.add([{kind: "event", segment: 0, code: "graceful_stop", resume_from: 300,
                  text: "The session wall at step 300: stopped gracefully", t: 301}]);
        view({state: "restarting", stage: "restarting", segment: 0});
        out.push(state(null), blocked());
    """)
    assert out[0] == "preempted"
    assert out[1] == "Preempted: it is restarting from its checkpoint."
    assert out[2] == ["preempted", "The session wall at step 300: stopped gracefully"]


def test_an_armed_kill_is_armed_until_its_restart_event_then_crashed() -> None:
    # Crash mode during_save: the server arms the kill, the run trains on (its view says
    # running), and the state says what the kill waits for until the supervisor's event.
    out = run_js("""
        preset = {crash: {mode: "during_save"}, run: {ckpt_every: 100}, knob: {name: "ckpt_write"}};
        view({state: "running", stage: "train", segment: 0, crashes: 0});
        run.add([step(0, 1), step(0, 135)]);
        run.armed = {segment: 0, pid: 42, step: 135};
        view({state: "running", stage: "train", segment: 0, step: 150, crashes: 1});
        out.push(state(null), blocked());
        run.armed = null;  // a reload: only the run view's pending kill says it
        out.push(state(null)[0]);
        view({pending_kill: {kind: "crash", mode: "during_save", armed: true, at_step: 135,
                             segment: 0}});
        out.push(state(null)[0]);
        run.add([{kind: "event", segment: 0, code: "crash", resume_from: 100, at_step: 199,
                  text: "Crash test: killed … at step 199, in the middle of writing"
                        + " the checkpoint for step 200", t: 5}]);
        view({state: "restarting", stage: "restarting", segment: 0, crashes: 1});
        out.push(state(null)[0]);
    """)
    assert out[0] == [
        "kill armed",
        "Crash test armed: SIGKILL at the next checkpoint write (step 200). It trains on"
        " until that write begins.",
    ]
    assert out[1] == "Crash test armed: the SIGKILL lands when the next checkpoint write begins."
    assert out[2] != "kill armed"  # a count of crash tests is not evidence
    assert out[3] == "kill armed"
    assert out[4] == "crashed"


def test_after_a_reload_a_preemption_then_an_armed_crash_test_is_still_kill_armed() -> None:
    # One preemption (segment 0 → 1), then an armed crash test in segment 1: crashes (1)
    # is not ahead of the segment (1), and only the view's pending kill says it is armed.
    out = run_js("""
        preset = {crash: {mode: "during_save"}, run: {ckpt_every: 100}, knob: {name: "ckpt_write"}};
        run.add([step(0, 1), step(0, 40),
                 {kind: "event", segment: 0, code: "preempt", resume_from: 40, at_step: 40,
                  text: "Preempted", t: 41},
                 step(1, 41), step(1, 60)]);
        view({state: "running", stage: "train", segment: 1, crashes: 1, step: 60,
              can_crash: false, pending_kill: {kind: "crash", mode: "during_save",
              armed: true, at_step: 55, segment: 1}});
        out.push(state(null), blocked());
        view({pending_kill: {kind: "crash", mode: "during_save", armed: true, at_step: 55,
              segment: 0}});  // one of an older segment is not this one's
        out.push(state(null)[0]);
        view({pending_kill: null, can_crash: true});
        out.push(state(null)[0], blocked());
    """)
    assert out[0][0] == "kill armed", out
    assert "SIGKILL at the next checkpoint write (step 100)" in out[0][1], out
    assert out[1] == "Crash test armed: the SIGKILL lands when the next checkpoint write begins."
    assert out[2] != "kill armed"
    assert out[3] == "training" and out[4] is None, out


def test_a_trainer_that_reported_failed_is_failed_before_the_supervisor_says_so() -> None:
    out = run_js("""
        view({state: "running", stage: "train", segment: 0});
        run.add([step(0, 1)]);
        view({state: "running", stage: "failed", segment: 1});  // a refusal: exit 3 follows
        out.push(state(null)[0], blocked());
    """)
    assert out == ["failed", "Failed: there is no training process left to kill."]


def test_a_wall_s_stop_is_preempted_when_the_view_already_names_the_next_segment() -> None:
    # Seen under load in lesson 1.14: the view said segment 1 (stage restarting) before
    # the new trainer's first step; the stop event is segment 0's.
    out = run_js("""
        preset = {crash: {wall_step: 300}};
        view({state: "running", stage: "train", segment: 0});
        run.add([step(0, 300)]);
        run.add([{kind: "event", segment: 0, code: "preempt", resume_from: 300,
                  text: "The session wall at step 300: stopped gracefully", t: 301}]);
        view({state: "running", stage: "restarting", segment: 1});
        out.push(state(null)[0], blocked());
    """)
    assert out == ["preempted", "Preempted: it is restarting from its checkpoint."]


def test_a_stale_restarting_view_after_the_restart_trains_is_not_a_crash() -> None:
    # Seen under load in lesson 1.14: segment 1 had trained when a view still said stage
    # restarting; the card said "crashed" for a wall's graceful stop.
    out = run_js("""
        preset = {crash: {wall_step: 300}};
        view({state: "running", stage: "train", segment: 0, steps: 600});
        run.add([step(0, 300)]);
        run.add([{kind: "event", segment: 0, code: "preempt", resume_from: 300, t: 301},
                 {kind: "resume", segment: 1, from_step: 300, path: "ckpt/step-300", t: 302},
                 step(1, 301)]);
        view({state: "running", stage: "restarting", segment: 1, step: 300,
              latest: {step: {segment: 0, step: 300}}});  // built before step 301
        out.push(state(null)[0], blocked());
        view({state: "running", stage: "restarting", segment: 1, step: 301,
              latest: {step: {segment: 1, step: 301}}});  // a restart of segment 1 itself
        out.push(state(null)[0]);
    """)
    assert out == ["resuming", None, "crashed"]  # resumed at 300: "nothing was lost"


def test_a_crashed_card_names_the_checkpoint_its_restart_found_or_that_none_was_left() -> None:
    out = run_js("""
        run.add([step(0, 150)]);
        view({state: "running", stage: "train", step: 150});
        run.signalled = 0;
        view({state: "restarting", stage: "restarting"});
        out.push(state(null));
        run.add([{kind: "event", id: 9, segment: 0, code: "crash", level: "warn", at_step: 150,
                  resume_from: null, lost_steps: 150, crash_mode: "host", t: 151,
                  text: "Crash test: killed the process"}]);
        out.push(state(null));
    """)
    assert out[0] == ["crashed", "Killed with SIGKILL (no chance to save). Restarting."]
    # 1.15's run A: its disk went with the kill; the card never says it resumes.
    assert out[1] == [
        "crashed",
        "Killed with SIGKILL (no chance to save). Restarting; no checkpoint was left where it"
        " restarts.",
    ]


def test_a_restart_that_has_loaded_nothing_yet_says_restarting_never_resuming() -> None:
    # A preemption before its event, and a restarted trainer that has not loaded a
    # checkpoint: what it resumes from (or that it refuses) is said only once it did.
    out = run_js("""
        view({state: "running", stage: "train", segment: 0, step: 150});
        run.add([step(0, 150)]);
        run.signalled = 0;
        view({state: "running", stage: "restarting", segment: 0});
        run.add([{kind: "event", segment: 0, code: "crash", resume_from: 100, t: 151}]);
        view({state: "running", stage: "starting", segment: 1, crashes: 1, step: 150});
        out.push(state(null));
        run.add([{kind: "resume", segment: 1, from_step: 100, t: 152}, step(1, 101)]);
        view({state: "running", stage: "train", segment: 1, crashes: 1, step: 101});
        out.push(state(null)[0]);
    """)
    assert out[0][0] == "restarting" and "resum" not in out[0][1].lower(), out[0]
    assert out[1] == "resuming"  # the restart loaded step 100 and recomputes from there


def test_a_preemption_before_its_event_promises_no_resume() -> None:
    out = run_js("""
        view({state: "running", stage: "train", segment: 0});
        run.add([step(0, 1), step(0, 40)]);
        run.signalled = 0;
        run.signalledKind = "preempt";  // the Preempt button's request (app.js)
        view({state: "running", stage: "restarting", segment: 0});
        out.push(state(null));
    """)
    assert out[0][0] == "preempted"
    assert "It resumes" not in out[0][1] and "Restarting" in out[0][1], out[0]
