"""A hold (workers/hold.py) stops a trainer outside any checkpoint write: one stopped
inside a write is let go on until the write has ended, then stopped again; one whose
write does not end in time is not held. The trainer is a stand-in that records signals,
then the stand-in trainer under a real supervisor (real SIGSTOP, its writes announced)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from crashdrill.trainer.checkpoint_pause import write_open, writing_line
from crashdrill.workers import hold as hold_module
from crashdrill.workers.hold import Hold
from tests.support.supervising import supervise, wait_for_step

pytestmark = pytest.mark.timeout(60)


class SignalRecorder:
    pid = 4242
    started = 0.0

    def __init__(self) -> None:
        self.signals: list[int] = []

    def wait(self, timeout: float) -> int | None:
        return None

    def signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_a_hold_never_stops_a_trainer_inside_a_checkpoint_write():
    proc = SignalRecorder()
    writes = iter([100, 100, None])  # inside step 100's write twice, then out of it
    hold = Hold("run", lambda: next(writes))
    assert hold.start(proc, 30) and hold.held
    stop, cont = signal.SIGSTOP, signal.SIGCONT
    assert proc.signals == [stop, cont, stop, cont, stop]  # the last stop is outside it
    assert hold.release() and proc.signals[-1] == cont


def test_a_hold_whose_write_does_not_end_in_time_leaves_the_trainer_running(monkeypatch):
    monkeypatch.setattr(hold_module, "WRITE_WAIT_S", 0.0)
    proc = SignalRecorder()
    hold = Hold("run", lambda: 100)
    assert not hold.start(proc, 30) and not hold.held
    assert proc.signals[-1] == signal.SIGCONT


def test_a_closed_hold_releases_the_trainer_and_refuses_a_hold_asked_for_after_it():
    proc = SignalRecorder()
    hold = Hold("run")
    assert hold.start(proc, 30)
    assert hold.close() and proc.signals == [signal.SIGSTOP, signal.SIGCONT]
    # A question answered while the run stops: no SIGSTOP after the SIGCONT, which would
    # leave it stopped once the server (and the hold's release timer) is gone.
    assert not hold.start(proc, 30) and not hold.held
    assert proc.signals == [signal.SIGSTOP, signal.SIGCONT]
    assert not hold.close()


def test_a_hold_outside_any_write_stops_the_trainer_once():
    proc = SignalRecorder()
    hold = Hold("run")
    assert hold.start(proc, 30)
    assert proc.signals == [signal.SIGSTOP]
    hold.release()


def test_a_hold_of_a_trainer_that_is_gone_is_refused():
    class Gone(SignalRecorder):
        def signal(self, sig: int) -> None:
            raise ProcessLookupError(self.pid)

    assert not Hold("run").start(Gone(), 30)


def test_a_supervised_trainer_is_never_held_inside_the_writes_it_announces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in spends about half its time in checkpoint writes (0.2 s every 10 steps
    # of 0.02 s), each said on stderr as the lab's trainers say them: a hold stopped at a
    # moment of its own choosing would land inside one about every other time.
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "400")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.02")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "10")
    monkeypatch.setenv("CRASHDRILL_STANDIN_WRITE_S", "0.2")
    sup, changes, rd = supervise(tmp_path)
    sup.start()
    try:
        wait_for_step(rd, 12)  # past its first write
        for n in range(8):
            time.sleep(0.07 * (n + 1))  # a different phase of the write cycle each time
            assert sup.hold(30), "the trainer could not be held"
            time.sleep(0.05)
            said = rd.stderr.read_text()
            assert writing_line(10) in said, "the trainer announced no write"
            assert write_open(said) is None, f"held inside the write of step {write_open(said)}"
            assert sup.release()
    finally:
        sup.stop("the test")
        changes.wait_for("stopped")
