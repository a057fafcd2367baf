"""The supervisor tells a graceful stop from a crash: a preemption (SIGTERM, SIGKILL after
the grace) or a stop the trainer made itself is resumed, and its event says what the stop
cost. Against the stand-in trainer: real processes, real signals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crashdrill.workers.graceful_stop import Wall
from crashdrill.workers.launch import NotRunning
from crashdrill.workers.run_dir import RunDir
from tests.support.supervising import records, supervise, wait_for_step

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "60")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.03")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "25")
    return monkeypatch


def _events(rd: RunDir, code: str) -> list[dict[str, Any]]:
    return [r for r in records(rd) if r["kind"] == "event" and r.get("code") == code]


def test_a_preempted_trainer_that_stops_gracefully_resumes_losing_nothing(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_GRACEFUL", "1")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 27)
    sup.preempt(10)
    changes.wait_for("restarting")
    changes.wait_for("finished")
    (event,) = _events(rd, "preempt")
    assert event["lost_steps"] == 0 and event["resume_from"] == event["at_step"]
    assert event["at_step"] > 25 and event["crash_mode"] == "preempt"
    assert event["text"].startswith("Preempted: SIGTERM with a 10s grace, then SIGKILL.")
    assert "stopped gracefully at step" in event["text"]
    saved = f"The stop lost nothing: it saved step {event['at_step']}, the last step it trained."
    assert event["text"].endswith(saved) and event["level"] == "info"


def test_a_trainer_without_a_handler_dies_on_the_sigterm_and_loses_its_steps(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 27)
    sup.preempt(10)
    changes.wait_for("finished")
    (event,) = _events(rd, "preempt")
    assert event["resume_from"] == 25 and event["lost_steps"] == event["at_step"] - 25 > 0
    assert "ended the trainer on the spot" in event["text"] and event["level"] == "warn"
    assert f"The stop cost {event['lost_steps']} steps." in event["text"]


def test_a_trainer_too_slow_for_the_grace_is_killed_when_it_runs_out(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_GRACEFUL", "1")
    env.setenv("CRASHDRILL_STANDIN_SAVE_S", "20")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 27)
    sup.preempt(0.5)
    changes.wait_for("finished")
    (event,) = _events(rd, "preempt")
    assert "did not stop within the grace and was killed" in event["text"]
    assert event["resume_from"] == 25 and event["lost_steps"] == event["at_step"] - 25 > 0


def test_a_graceful_stop_nobody_asked_for_is_resumed_as_a_stop(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_STOP_AT", "15")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    changes.wait_for("finished")
    (event,) = _events(rd, "graceful_stop")
    assert event["at_step"] == event["resume_from"] == 15 and event["lost_steps"] == 0
    assert event["text"].startswith("A graceful stop. The trainer stopped gracefully at step 15")
    assert not _events(rd, "killed") and not _events(rd, "crash")


def test_stops_in_a_row_at_one_step_fail_the_run_instead_of_looping(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_STOP_AT", "15")
    env.setenv("CRASHDRILL_STANDIN_STOP_ALWAYS", "1")
    sup, changes, _ = supervise(tmp_path)
    sup.start()
    failed = changes.wait_for("failed")
    assert "2 times in a row at step 15" in failed.text
    assert failed.exit_code == 75


def test_preempting_a_run_with_no_trainer_is_refused(tmp_path: Path) -> None:
    sup, _, _ = supervise(tmp_path)
    with pytest.raises(NotRunning):
        sup.preempt(5)


def test_a_session_wall_preempts_each_run_once_when_it_passes_the_step(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_GRACEFUL", "1")
    sup, changes, rd = supervise(tmp_path, wall=Wall(20, 5.0))
    sup.start()
    changes.wait_for("finished")
    (event,) = _events(rd, "preempt")
    assert event["text"].startswith("The session wall at step 20: SIGTERM with a 5s grace")
    assert event["at_step"] >= 20 and event["lost_steps"] == 0
