"""The supervisor against the stand-in trainer: real processes, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.event_record import event as make_event
from crashdrill.workers.launch import Launch, NotRunning
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.support.lab import STAND_IN
from tests.support.supervising import Changes, records, supervise, wait_for_step

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "40")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "10")
    return monkeypatch


def test_a_run_that_exits_0_is_finished(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    done = changes.wait_for("finished")
    assert done.exit_code == 0
    assert changes.states() == ["running", "finished"]
    assert rd.stdout.exists() and "starting fresh" in rd.stderr.read_text()


def test_sigkill_restarts_with_require_checkpoint_and_logs_the_crash(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 15)
    killed = sup.crash()
    changes.wait_for("finished")
    assert changes.states() == ["running", "restarting", "running", "finished"]
    assert changes.items[0].pid == killed != changes.items[2].pid
    recs = records(rd)
    crash = next(r for r in recs if r.get("code") == "crash")
    assert crash["segment"] == 0 and crash["level"] == "info"
    text = str(crash["text"])
    assert text.startswith("Crash test: killed the process with SIGKILL (no chance to save)")
    assert f"The newest checkpoint on its disk is at step {crash['resume_from']}" in text
    resume = next(r for r in recs if r["kind"] == "resume")
    assert resume["segment"] == 1 and resume["from_step"] == crash["resume_from"]
    assert recs.index(crash) < recs.index(resume)
    assert "resumed at step" in rd.stderr.read_text()


def test_a_crash_before_the_first_checkpoint_starts_over(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "1000")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 3)
    sup.crash()
    changes.wait_for("finished")
    crash = next(r for r in records(rd) if r.get("code") == "crash")
    assert "no checkpoint yet, so the run starts over from step 0" in str(crash["text"])
    assert "starting fresh" in rd.stderr.read_text().split("\n", 1)[1]


def test_another_exit_status_fails_the_run_and_keeps_the_stderr_tail_out_of_the_records(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_FAIL_AT", "5")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    failed = changes.wait_for("failed")
    assert failed.exit_code == 1
    assert "exit status 1" in failed.text
    # The traceback (the repo's and the run's paths) is for the log and the instructor.
    assert "RuntimeError: stand-in failure" in failed.detail and 'File "' in failed.detail
    assert "Traceback" not in failed.text and "/" not in failed.text
    recs = records(rd)
    assert recs[-2]["code"] == "failed" and recs[-2]["level"] == "error"
    assert recs[-1] == {**recs[-1], "kind": "stage", "stage": "failed"}
    text = rd.records.read_text()
    assert "Traceback" not in text and "stand-in failure" not in text


def test_a_run_that_diverges_is_diverged_not_failed_and_is_not_restarted(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_DIVERGE_AT", "13")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    diverged = changes.wait_for("diverged")
    sup.join(5)
    assert diverged.exit_code == 4
    assert diverged.text == "Diverged at step 13: the loss is nan."  # the trainer's event
    assert diverged.detail == ""
    assert changes.states() == ["running", "diverged"]  # no restart, no failure
    recs = records(rd)
    assert [r.get("code") for r in recs if r["kind"] == "event"][-1] == "diverged"
    assert recs[-1] == {**recs[-1], "kind": "stage", "stage": "diverged"}


def test_a_restart_that_finds_no_checkpoint_fails_with_exit_3(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("CRASHDRILL_STANDIN_STARTUP_S", "0.3")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 15)
    sup.crash()
    changes.wait_for("running", 2)
    for d in (rd.path / "ckpt").iterdir():  # the checkpoints vanish while it restarts
        (d / "MANIFEST.json").unlink()
    failed = changes.wait_for("failed")
    assert failed.exit_code == 3
    assert "no complete checkpoint to resume from" in failed.text


def test_stop_ends_the_run_without_a_restart(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 3)
    sup.stop("its owner")
    changes.wait_for("stopped")
    assert changes.states() == ["running", "stopped"]
    assert records(rd)[-1]["text"] == "Stopped by its owner."
    with pytest.raises(NotRunning):
        sup.crash()


def test_a_stop_whose_trainer_ends_at_its_sigterm_sends_no_sigkill_after_the_grace(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    """The SIGKILL a Stop keeps for after its grace is called off when the trainer ends:
    a pid may be reused meanwhile, and on a cluster the call would go to an actor (or a
    closed connection) of a run that is over."""
    from crashdrill.workers import supervisor
    from crashdrill.workers.local_executor import LocalExecutor

    env.setattr(supervisor, "STOP_GRACE_S", 0.5)
    sent: list[int] = []

    class Recording(LocalExecutor):
        def start(self, *args: Any, **kwargs: Any) -> Any:
            trainer = super().start(*args, **kwargs)
            send = trainer.signal

            def signal_(sig: int) -> None:
                sent.append(int(sig))
                send(sig)

            env.setattr(trainer, "signal", signal_)
            return trainer

    changes = Changes()
    sup = Supervisor(
        Launch(tmp_path / "run", "quick", "A", command=STAND_IN),
        changes,
        poll_s=0.05,
        executor=Recording(),
    )
    sup.start()
    wait_for_step(RunDir(tmp_path / "run"), 3)
    sup.stop("its owner")
    changes.wait_for("stopped")
    time.sleep(1.5)  # three graces
    assert sent == [int(signal.SIGTERM)]


def test_a_kill_nobody_asked_for_is_resumed_too(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 15)
    os.kill(changes.items[0].pid or 0, signal.SIGKILL)  # the out-of-memory killer, say
    changes.wait_for("finished")
    event = next(r for r in records(rd) if r.get("code") == "killed")
    assert event["level"] == "warn" and "without a crash test" in str(event["text"])


def test_a_rank_crash_of_a_one_rank_run_is_refused_saying_why_and_the_run_goes_on(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    wait_for_step(rd, 5)
    with pytest.raises(NotRunning, match=r"one rank of a run with several ranks.*ranks = 1"):
        sup.crash("rank")
    changes.wait_for("finished")
    assert changes.states() == ["running", "finished"]  # not killed, not restarted
    assert not [r for r in records(rd) if r.get("code") == "crash"]


def test_adopt_watches_a_trainer_started_by_someone_else(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*STAND_IN, "quick", "--run-dir", str(run_dir), "--label", "A"],
        start_new_session=True,
        stderr=subprocess.DEVNULL,
    )
    sup, changes, rd = supervise(tmp_path)
    wait_for_step(rd, 12)
    assert sup.adopt([None, 999_999_999, proc.pid])
    assert changes.items[0].pid == proc.pid
    sup.crash()
    proc.wait()  # we are its parent here: reap it so the adopted watcher sees it gone
    changes.wait_for("finished")
    assert changes.states() == ["running", "restarting", "running", "finished"]
    assert any(r.get("code") == "crash" for r in records(rd))


def test_adopt_refuses_a_pid_that_is_not_a_trainer_of_this_run(tmp_path: Path) -> None:
    sup, _, _ = supervise(tmp_path)
    assert not sup.adopt([os.getpid(), None])


def test_append_records_ends_a_torn_line_first(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.records.write_text('{"kind":"step","step":1}\n{"kind":"st')
    rd.append_records([make_event("mirror_unreachable", "hi", segment=0)])
    lines = rd.records.read_text().splitlines()
    assert lines[1] == '{"kind":"st'
    assert json.loads(lines[2])["text"] == "hi"
    assert rd.last_seen() == (0, 1, None)
