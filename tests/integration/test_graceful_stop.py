"""Real processes, real signals: a SIGTERM (or the time budget) ends a run at a step
boundary with a complete checkpoint and exit 75, and the same command resumes it without
losing a step, bit for bit; a platform's SIGKILL inside that save leaves the previous
checkpoint standing, and the next start says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from crashdrill.trainer.checkpoint_layout import find_latest, step_dir_name
from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.trainer.checkpoint_pause import format_pause, paused_line
from crashdrill.trainer.exit_codes import EXIT_STOPPED
from crashdrill.trainer.preemption import EXIT_S, STOP_MARKER
from crashdrill.trainer.records import read_records
from tests.conftest import crashdrill_cmd, run_cli

pytestmark = pytest.mark.slow
STEPS, EVERY = 60, 20
SMALL = [
    "run",
    "quick",
    "--jsonl",
    "--quiet",
    *("--set", f"steps={STEPS}", "--set", f"ckpt_every={EVERY}", "--set", "warmup=5"),
    *("--set", "eval_every=20", "--set", "probe_every=20", "--set", "sample_every=60"),
]


def _records(run_dir: Path, kind: str, code: str | None = None) -> list[dict]:
    recs, _ = read_records(run_dir / "records.jsonl")
    return [r for r in recs if r["kind"] == kind and (code is None or r.get("code") == code)]


def _bits(run_dir: Path) -> dict[int, int]:
    """Each step's loss bits, the newest segment's where a step was run twice."""
    return {r["step"]: r["loss_bits"] for r in _records(run_dir, "step")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, int]:
    ref = tmp_path_factory.mktemp("ref")
    run_cli(*SMALL, "--run-dir", str(ref), check=True)
    return _bits(ref)


class Trainer:
    """One `crashdrill run` process whose stdout steps and stderr lines the test reads."""

    def __init__(self, run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            crashdrill_cmd(*SMALL, "--run-dir", str(run_dir), *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.stderr: list[str] = []
        self.err_seen = threading.Condition()
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.err_seen:
                self.stderr.append(line)
                self.err_seen.notify_all()

    def wait_step(self, step: int) -> int:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            seen = int(json.loads(line)["step"])
            if seen >= step:
                return seen
        raise AssertionError(f"exited before step {step}:\n{self.err()}")

    def wait_stderr(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self.err_seen:
            while not any(text in line for line in self.stderr):
                assert time.monotonic() < deadline, f"never said {text!r}:\n{self.err()}"
                self.err_seen.wait(0.1)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 60) -> int:
        assert self.proc.stdout is not None
        self.proc.stdout.read()
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code

    def err(self) -> str:
        with self.err_seen:
            return "".join(self.stderr)


def _resume_to_the_end(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*SMALL, "--run-dir", str(run_dir), "--require-checkpoint", check=True)


def _stopped(run_dir: Path) -> dict:
    (event,) = _records(run_dir, "event", "stopped_gracefully")
    return event


def _pause_everywhere_but_the_cadence(seconds: float) -> dict[str, str]:
    """Every graceful save pauses inside its write; the cadence's saves do not."""
    steps = [s for s in range(1, STEPS) if s % EVERY]
    return {PAUSE_ENV: format_pause(steps, seconds)}


@pytest.mark.timeout(240)
def test_sigterm_during_a_step_finishes_it_saves_it_and_loses_nothing(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir)
    seen = trainer.wait_step(7)
    trainer.signal(signal.SIGTERM)
    assert trainer.finish() == EXIT_STOPPED
    event = _stopped(run_dir)
    step = event["step"]
    assert seen <= step < EVERY, "the step in flight finishes; no later cadence point waited"
    assert event["reason"] == "SIGTERM" and event["within_grace"] is True
    assert event["checkpoint_step"] == step and event["save_seconds"] < event["grace_s"]
    assert (
        f"stopped gracefully at step {step} after SIGTERM; checkpoint {step_dir_name(step)};"
        " resume with the same command" in trainer.err()
    )
    latest = find_latest(run_dir)
    assert latest is not None and latest.step == step  # complete: its manifest verifies
    resumed = _resume_to_the_end(run_dir)
    assert f"resumed at step {step} from" in resumed.stderr
    assert not (run_dir / STOP_MARKER).exists()
    assert _bits(run_dir) == reference


@pytest.mark.timeout(240)
def test_sigterm_during_a_checkpoint_write_lets_it_finish_and_stops_there(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir, env={PAUSE_ENV: format_pause(EVERY, 2)})
    trainer.wait_stderr(paused_line(EVERY))
    trainer.signal(signal.SIGTERM)
    assert trainer.finish() == EXIT_STOPPED
    assert _stopped(run_dir)["step"] == EVERY
    writes = [r for r in _records(run_dir, "ckpt") if r["step"] == EVERY]
    assert len(writes) == 1, "the write in flight is the stop's checkpoint: not written twice"
    _resume_to_the_end(run_dir)
    assert _bits(run_dir) == reference


@pytest.mark.timeout(240)
def test_sigterm_during_an_eval_lets_the_eval_finish_first(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir, "--set", "eval_batches=400")  # an eval of a few seconds
    trainer.wait_step(EVERY)  # the eval of step 20 starts right after its step line
    trainer.signal(signal.SIGTERM)
    assert trainer.finish() == EXIT_STOPPED
    assert _stopped(run_dir)["step"] == EVERY
    assert [r["step"] for r in _records(run_dir, "val")] == [EVERY], "its eval was written"
    _resume_to_the_end(run_dir)
    assert _bits(run_dir) == reference


@pytest.mark.timeout(300)
def test_signals_twice_in_a_row_stop_once_and_two_stops_in_a_row_lose_nothing(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir, env=_pause_everywhere_but_the_cadence(1.0))
    trainer.wait_step(5)
    trainer.signal(signal.SIGTERM)
    trainer.wait_stderr("paused inside checkpoint write")
    trainer.signal(signal.SIGTERM)  # the platform repeats itself; a user presses Ctrl-C
    trainer.signal(signal.SIGINT)
    assert trainer.finish() == EXIT_STOPPED
    first = _stopped(run_dir)
    assert len(_records(run_dir, "event", "stopping")) == 1
    latest = find_latest(run_dir)
    assert latest is not None and latest.step == first["step"]

    again = Trainer(run_dir, "--require-checkpoint")
    again.wait_step(first["step"] + 15)
    again.signal(signal.SIGINT)
    assert again.finish() == EXIT_STOPPED
    second = _records(run_dir, "event", "stopped_gracefully")[-1]
    assert second["reason"] == "SIGINT" and second["step"] > first["step"]
    _resume_to_the_end(run_dir)
    assert _bits(run_dir) == reference


@pytest.mark.timeout(240)
def test_a_grace_too_short_for_the_write_leaves_the_previous_checkpoint_and_says_so(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir, env=_pause_everywhere_but_the_cadence(30))
    trainer.wait_step(5)
    trainer.signal(signal.SIGTERM)
    trainer.wait_stderr("paused inside checkpoint write")
    trainer.signal(signal.SIGKILL)  # the platform's grace ran out mid-write
    assert trainer.finish() == -signal.SIGKILL
    marker = json.loads((run_dir / STOP_MARKER).read_text())
    assert marker["state"] == "saving"
    latest = find_latest(run_dir)
    assert latest is not None and latest.step == 0, "the torn write does not count"

    resumed = _resume_to_the_end(run_dir)
    assert "resumed at step 0 from" in resumed.stderr
    assert f"WARNING The graceful stop at step {marker['step']} (SIGTERM)" in resumed.stderr
    (lost,) = _records(run_dir, "event", "graceful_stop_lost")
    assert lost["lost_steps"] == marker["step"] and lost["level"] == "warn"
    assert _bits(run_dir) == reference


@pytest.mark.timeout(240)
def test_the_time_budget_stops_before_the_wall_and_the_next_session_goes_on(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    budget = 12.0
    session = [*SMALL, "--set", "steps=100000", "--run-dir", str(run_dir), "--stop-after", "12s"]
    t0 = time.time()
    first = run_cli(*session)
    wall = time.time() - t0
    assert first.returncode == EXIT_STOPPED, first.stderr
    event = _stopped(run_dir)
    # The save was complete and said so before the wall, with the exit's margin (EXIT_S)
    # still left; the exit itself (interpreter and torch teardown) can take longer than
    # that margin on a loaded machine, so the process's own end gets some slack.
    saved_at = event["t"] - t0
    assert saved_at < budget - EXIT_S, f"saved {saved_at:.1f}s into a {budget}s budget"
    assert wall < budget + 5, f"the process lived {wall:.1f}s of a {budget}s budget"
    assert event["reason"] == "stop_after" and event["step"] > 0
    assert "after its time budget (stop_after 12.0s)" in first.stderr
    second = run_cli(*session, "--require-checkpoint")
    assert second.returncode == EXIT_STOPPED, second.stderr
    assert f"resumed at step {event['step']} from" in second.stderr
    assert _records(run_dir, "event", "stopped_gracefully")[-1]["step"] > event["step"]


def test_a_bad_stop_after_is_refused_with_what_is_allowed(tmp_path: Path) -> None:
    bad = run_cli(*SMALL, "--run-dir", str(tmp_path / "r"), "--stop-after", "soon")
    assert bad.returncode == 2
    assert "stop_after = 'soon' is not allowed: a duration like '11h30m'" in bad.stderr


@pytest.mark.timeout(240)
def test_a_stop_with_a_mirror_copies_its_checkpoint_there_before_it_exits(tmp_path: Path) -> None:
    run_dir, mirror = tmp_path / "run", tmp_path / "mirror"
    trainer = Trainer(run_dir, "--mirror", str(mirror))
    trainer.wait_step(7)
    trainer.signal(signal.SIGTERM)
    assert trainer.finish() == EXIT_STOPPED
    event = _stopped(run_dir)
    assert event["mirrored"] is True and event["within_grace"] is True
    assert "copied to the mirror" in event["text"]
    copies = [p.name for p in mirror.rglob(step_dir_name(event["step"])) if p.is_dir()]
    assert copies, f"step {event['step']} is not in {sorted(p.name for p in mirror.rglob('*'))}"
