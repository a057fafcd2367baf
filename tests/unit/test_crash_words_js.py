"""The words around a Crash test (web/static/crash_words.js, crash_window.js): the hint
under the button follows the lesson's crash mode, the line after a kill says only what has
happened (the kill, then what the restart did once its trainer said so), a resume check's
cost line says what a stop saved, and the crash window is the preset's `[crash] window`,
named by its steps — run in node on the registry and presets the API serves."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.lessons.policy import public_view
from crashdrill.trainer.crash_modes import MODES, modes_json
from crashdrill.trainer.presets import get_preset, list_presets

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")


def js(steps: str, **values: Any) -> Any:
    """Run `steps` (JS statements that push onto `out`) with `w` the crash words module,
    `cw` the crash window module and each of `values` as a constant."""
    words, window = (
        json.dumps((STATIC / m).as_uri()) for m in ("crash_words.js", "crash_window.js")
    )
    consts = "\n".join(f"const {k} = {json.dumps(v)};" for k, v in values.items())
    code = f"""
        Promise.all([import({words}), import({window})]).then(([w, cw]) => {{
            {consts}
            const out = [];
            {steps}
            console.log(JSON.stringify(out));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_crash_hint_follows_each_registered_mode_s_fields() -> None:
    hints = js(
        "for (const m of modes) out.push([m.name, w.crashHint(m, false), w.crashHint(m, true)]);",
        modes=modes_json(),
    )
    by_name = {name: (local, cluster) for name, local, cluster in hints}
    assert set(by_name) == {m.name for m in MODES}
    assert by_name["kill"][0] == "Kills the process with SIGKILL now: no chance to save."
    armed = by_name["during_save"][0]  # 1.10: the kill waits for the next write
    assert "next checkpoint write" in armed and "SIGKILL now" not in armed
    wipe = by_name["wipe"][0]
    assert "checkpoints are deleted" in wipe and "mirror" in wipe
    local, cluster = by_name["host"]  # 1.15: the machine (or, on one machine, its disk)
    assert "no other machine" in local and "deleted" in local
    assert "another machine" in cluster
    assert len({h for pair in by_name.values() for h in pair}) == len(MODES) + 1


def test_a_kill_says_what_happened_and_the_restart_s_outcome_only_once_it_is_in() -> None:
    crash = {"code": "crash", "segment": 0, "at_step": 200, "save_step": 200, "resume_from": 100}
    out = js(
        """
        out.push(w.killText(16083, 198));                                // the answer only
        out.push(w.killText(16083, 200, crash));                         // the crash event
        out.push(w.killText(16083, 200, crash, {segment: 1, from: 100}));
        out.push(w.killText(16083, 198, crash, {segment: 1, refused: true, from: null}));
        out.push(w.killText(16083, 198, crash, {segment: 1, fresh: true, from: 0}));
        out.push(w.killText(16083, 200, crash, {segment: 1, refused: true, rejected: true}));
        """,
        crash=crash,
    )
    assert out[0] == "Killed process 16083 at step 198."
    assert out[1] == (
        "Killed process 16083 at step 200, in the middle of writing the checkpoint for step 200;"
        " restarting it."
    )
    assert out[2].endswith("; resumed from the checkpoint at step 100.")
    assert out[3].endswith(
        "; its restart found no checkpoint to load and refused to start (exit 3)."
    )
    assert out[4].endswith("; its restart found no checkpoint and started over from step 0.")
    assert out[5].endswith(  # 1.10's run B: its only checkpoint was torn by the kill
        "; its restart rejected its checkpoint (it failed its checks), found nothing older and"
        " refused to start (exit 3)."
    )
    assert not any("resumes" in t for t in out)  # no promise, ever


def test_a_rank_crash_says_which_rank_s_process_was_killed_once_its_event_is_in() -> None:
    crash = {"code": "crash", "segment": 0, "at_step": 63, "lost_rank": 1, "crash_mode": "rank"}
    steps = "out.push(w.killText(4251, 63, crash));"
    steps += "out.push(w.offerWords(modes.find((m) => m.one_rank)));"
    out = js(steps, crash=crash, modes=modes_json())
    assert out[0] == "Killed process 4251 (rank 1) at step 63; restarting it."
    assert out[1][0] == "Kill one rank"  # the offer button of a mode that kills one_rank


def test_a_restart_under_way_names_the_checkpoint_it_found_or_that_there_was_none() -> None:
    out = js(
        """
        out.push(w.restartingText({resume_from: 100}));
        out.push(w.restartingText({resume_from: null}));
        out.push(w.restartingText({resume_from: 100}, true));
        out.push(w.restartingText({resume_from: null}, true));
        out.push(w.restartingText(undefined));
        """
    )
    assert out[0] == "Restarting to load its checkpoint at step 100."
    assert out[1] == "Restarting; no checkpoint was left where it restarts."
    assert out[2] == "loading its checkpoint at step 100."
    assert "no checkpoint was left" in out[3]
    assert out[4] == "Restarting."


def test_a_check_s_cost_says_what_a_stop_saved_instead_of_costing_0_steps() -> None:
    out = js(
        """
        out.push(w.checkCost({expected_points: 0, from_step: 300}, "preempt"));
        out.push(w.checkCost({expected_points: 0, from_step: 300}, "crash"));
        out.push(w.checkCost({expected_points: 48, from_step: 100}, "crash"));
        out.push(w.checkCost({expected_points: 1, from_step: 100}, "preempt"));
        out.push(w.checkCost({expected_points: 178, from_step: null, outcome: "fresh"}));
        """
    )
    assert out[0] == (
        "Nothing to redo: the stop saved a checkpoint of step 300, the last step it trained,"
        " and the run resumed from it."
    )
    assert "cost 0" not in out[1] and "step 300" in out[1]
    assert out[2].startswith("The crash cost 48 steps of work")
    assert out[3].startswith("The stop cost 1 step of work")
    assert out[4].startswith("The crash cost all 178 steps")


def test_the_crash_window_is_the_preset_s_key_and_its_text_is_free_to_change() -> None:
    served = public_view(get_preset("lesson-1.7-fast"))
    reworded = {**served, "what_to_watch": "Crash whenever it suits you."}
    out = js(
        """
        for (const p of [served, reworded]) out.push(cw.crashWindow(p, 600, "A"));
        const win = cw.crashWindow(served, 600, "B");
        out.push(cw.windowText(win, 236, [], true));
        out.push(cw.windowText(win, 300, [], true));
        out.push(cw.windowText(win, 520, [301], true));
        out.push(cw.windowText(win, 520, [], true));
        out.push(cw.crashWindow({crash: {mode: "kill"}}, 600, "A"));
        """,
        served=served,
        reworded=reworded,
    )
    assert out[0] == out[1] == {"from": 250, "to": 500, "open": False}
    assert out[2] == ["crash window, steps 250–500: opens in 14 steps", "wait"]
    assert out[3] == ["crash window, steps 250–500: crash now", "now"]
    assert out[4] == ["crash test at step 301: inside the lesson's window, steps 250–500 ✓", "hit"]
    assert out[5][1] == "missed" and "steps 250–500" in out[5][0]
    assert out[6] is None


def test_an_open_window_lasts_to_the_run_s_end_and_each_run_may_have_its_own() -> None:
    preset = get_preset("lesson-1.10")
    own = replace(preset, crash=replace(preset.crash, window={"A": (120, None), "B": (250, 400)}))
    out = js(
        """
        out.push(cw.crashWindow(p, 600, "A"));
        out.push(cw.crashWindow(own, 900, "A"), cw.crashWindow(own, 900, "B"));
        """,
        p=public_view(preset),
        own=public_view(own),
    )
    assert out == [
        {"from": 100, "to": 600, "open": True},
        {"from": 120, "to": 900, "open": True},
        {"from": 250, "to": 400, "open": False},
    ]


def test_every_built_in_lesson_that_asks_for_a_moment_declares_its_window() -> None:
    # The six whose "what to watch" names a step to crash after (or between): their window
    # is the preset's key, so the text can change without losing it.
    windows = {p.id: p.crash.window for p in list_presets() if p.crash.window}
    assert set(windows) >= {
        "lesson-1.7",
        "lesson-1.7-fast",
        "lesson-1.8",
        "lesson-1.9",
        "lesson-1.10",
        "lesson-1.12",
    }
