"""The graceful stop's rules without a process: durations, the budget's margin, repeated
signals, the stop marker (trainer/preemption.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.config import ConfigError, TrainConfig
from crashdrill.trainer.event_record import event
from crashdrill.trainer.exit_codes import EXIT_STOPPED
from crashdrill.trainer.preemption import (
    EXIT_S,
    MIN_MARGIN_S,
    GracefulStop,
    StopMarker,
    check_previous_stop,
    parse_duration,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Events:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def event(
        self, code: str, text: str, level: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        self.seen.append(event(code, text, level=level, **fields))  # checked as the writer does
        return self.seen[-1]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("11h30m", 41400), ("45m", 2700), ("90s", 90), ("90", 90), ("1d2h", 93600), ("1.5h", 5400)],
)
def test_durations_read_the_way_a_person_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "0", "h", "-5m"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_exit_code_collides_with_none_the_cli_and_supervisor_use() -> None:
    assert EXIT_STOPPED not in (0, 1, 2, 3, 130, 141, 128 + signal.SIGTERM)


def test_the_budget_stops_when_what_is_left_is_the_measured_margin() -> None:
    clock = Clock()
    stop = GracefulStop(grace_s=30, stop_after_s=100, clock=clock, started=clock())
    stop.note_step(1.0)
    assert stop.margin_s() == MIN_MARGIN_S + 1.0 + EXIT_S  # no write measured yet
    stop.note_save(4.0)
    stop.note_save(3.0)  # the slowest counts
    assert stop.margin_s() == 2 * 4.0 + 1.0 + EXIT_S
    clock.now += 100 - stop.margin_s() - 0.01
    assert not stop.due()
    clock.now += 0.02
    assert stop.due() and stop.reason == "stop_after"
    assert stop.grace_left_s() == 30


def test_no_budget_and_no_signal_never_stops() -> None:
    clock = Clock()
    stop = GracefulStop(grace_s=30, clock=clock, started=clock())
    clock.now += 1e9
    assert not stop.due() and stop.budget_left_s() is None


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """SIGINT as in a foreground Python process, whatever this one inherited (a background
    job of a shell starts with it ignored); put back afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("sigint_default")
def test_a_second_signal_while_stopping_keeps_the_first_reason_and_its_grace() -> None:
    clock = Clock()
    stop = GracefulStop(grace_s=10, clock=clock, started=clock())
    assert stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        clock.now += 4
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the handler has it
    finally:
        stop.restore()
    assert stop.due() and stop.reason == "SIGTERM" and stop.signals_seen == 2
    assert stop.grace_left_s() == 6
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("sigint_default")
def test_graceful_stop_off_installs_no_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)  # another library's (ray.init sets one)
    stop = GracefulStop(grace_s=10, enabled=False)
    assert not stop.install()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_process_started_with_sigint_ignored_gets_it_back_ignored() -> None:
    """`crashdrill run … &` in a script: SIGINT is ignored from the start. The stop handles
    it while installed, and restores what the process was started with."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stop = GracefulStop(grace_s=10, clock=Clock())
        assert stop.install()
        os.kill(os.getpid(), signal.SIGINT)
        stop.restore()
        assert stop.due() and stop.reason == "SIGINT"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_stop_killed_inside_its_save_is_said_at_the_next_start(tmp_path: Path) -> None:
    StopMarker(42, "SIGTERM", "saving", previous_step=30, grace_s=1.0).write(tmp_path)
    events = Events()
    check_previous_stop(tmp_path, 30, events)
    (said,) = events.seen
    assert said["code"] == "graceful_stop_lost" and said["lost_steps"] == 12
    assert "resumed at step 30, 12 steps lost" in said["text"]
    assert StopMarker.read(tmp_path) is None


def test_a_stop_that_saved_is_not_a_loss(tmp_path: Path) -> None:
    StopMarker(42, "SIGTERM", "saved", previous_step=30, save_seconds=0.2).write(tmp_path)
    events = Events()
    check_previous_stop(tmp_path, 42, events)
    assert events.seen == [] and StopMarker.read(tmp_path) is None


@pytest.mark.parametrize(
    ("field", "value"), [("stop_after", "soon"), ("stop_grace", 0), ("graceful_stop", "maybe")]
)
def test_a_bad_graceful_stop_setting_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{field: value})
    assert e.value.field == field


def test_graceful_stop_settings_do_not_change_what_is_trained() -> None:
    plain = TrainConfig()
    other = TrainConfig(stop_after="11h30m", stop_grace=120.0, graceful_stop="off")
    assert plain.fingerprint() == other.fingerprint()
