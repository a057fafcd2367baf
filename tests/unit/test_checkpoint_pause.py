"""The checkpoint-pause hook's one home (trainer/checkpoint_pause.py): its value's format,
its parse with errors that say what was wrong, and the stderr line with its reader."""

from __future__ import annotations

import pytest

from crashdrill.trainer.checkpoint_pause import (
    ENV,
    PauseError,
    format_pause,
    parse_pause,
    paused_line,
    paused_step,
    pauses_from_env,
    without_write_lines,
    write_open,
    writing_line,
    written_line,
)


def test_format_pause_writes_what_parse_pause_reads_back():
    assert format_pause(150, 30) == "150:30"
    assert format_pause([200, 100, 100], 1.0) == "100:1,200:1"
    assert format_pause(7, 0.01) == "7:0.01"
    assert parse_pause(format_pause([100, 200], 0.5)) == {100: 0.5, 200: 0.5}
    exact = 1234567.25  # more digits than %g keeps: still read back exactly
    assert parse_pause(format_pause(3, exact)) == {3: exact}


def test_parse_pause_reads_steps_and_seconds_and_nothing_for_an_empty_value():
    assert parse_pause("7:0.01, 9:2") == {7: 0.01, 9: 2.0}
    assert parse_pause("") == {} and parse_pause(" , ") == {}
    assert pauses_from_env({}) == {}
    assert pauses_from_env({ENV: "150:8"}) == {150: 8.0}


@pytest.mark.parametrize(
    ("value", "item"),
    [
        ("A:100", "A:100"),  # a label where the step goes
        ("150", "150"),  # no seconds
        ("-1:5", "-1:5"),
        ("150:soon", "150:soon"),
        ("150:-2", "150:-2"),
        ("150:nan", "150:nan"),
        ("100:1,200:inf", "200:inf"),
    ],
)
def test_parse_pause_names_the_bad_item_and_the_format_allowed(value, item):
    with pytest.raises(PauseError) as caught:
        parse_pause(value)
    message = str(caught.value)
    assert ENV in message and repr(item) in message and "STEP:SECONDS" in message


@pytest.mark.parametrize(("steps", "seconds"), [(-1, 1.0), ([3, True], 1.0), (3, -0.5)])
def test_format_pause_refuses_what_the_trainer_could_not_read(steps, seconds):
    with pytest.raises(PauseError, match=ENV):
        format_pause(steps, seconds)


def test_paused_step_reads_the_line_the_trainer_prints_and_only_whole_lines():
    assert paused_step(paused_line(150)) == 150
    assert paused_step("[rank0]: " + paused_line(7)) == 7  # a launcher's prefix
    assert paused_step("step 150 loss 2.3") is None
    stream = f"resumed\n{paused_line(150)}\n".encode()
    assert paused_step(stream) == 150
    # A byte stream read mid-line: "…at step 15" of "…at step 150" must not count.
    assert paused_step(f"x\n{paused_line(150)}".encode()[:-1]) is None
    assert paused_step(f"x\n{paused_line(150)}".encode()) is None  # no newline yet
    assert paused_step(f"x\n{paused_line(150)}\r\n".encode()) == 150


def test_write_open_names_the_write_begun_and_not_ended_and_only_whole_lines():
    assert write_open("") is None
    assert write_open(f"{writing_line(100)}\n") == 100
    assert write_open(f"{writing_line(100)}\nnoise\n{written_line(100)}\n") is None
    stream = f"{writing_line(50)}\n{written_line(50)}\n{writing_line(100)}\n".encode()
    assert write_open(stream) == 100
    assert write_open(f"[rank0]: {writing_line(7)}\n") == 7  # a launcher's prefix
    # A line not finished yet does not count: "…begins at step 10" of "…at step 100".
    assert write_open(f"{writing_line(100)}".encode()[:-1]) is None
    assert write_open(f"{writing_line(100)}\n{written_line(100)}") == 100  # end not whole yet


def test_a_failure_s_tail_keeps_the_traceback_and_drops_the_write_lines():
    tail = f"{writing_line(100)}\n{written_line(100)}\nTraceback (most recent call last):\n  boom\n"
    assert without_write_lines(tail) == "Traceback (most recent call last):\n  boom\n"
    assert without_write_lines("no newline at the end") == "no newline at the end"
