"""The trainer's start line has one home (trainer/start_line.py): the lines it prints read
back as what they say, a line cut short never names a step, and no other module writes or
parses the line's text by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.drill.builtin import PresetTarget
from crashdrill.drill.target import Segment
from crashdrill.trainer.start_line import (
    FRESH_LINE,
    Start,
    read_start,
    refusal,
    refused_line,
    resumed_line,
    resumed_step,
)

ROOT = Path(__file__).parents[2]
CKPT = "/runs/a/ckpt/step-00000150"


def test_each_line_the_trainer_prints_reads_back_as_the_start_it_made() -> None:
    assert read_start(resumed_line(150, CKPT)) == Start("resumed", 150, CKPT)
    assert read_start(FRESH_LINE) == Start("fresh", 0)
    assert read_start(refused_line("/runs/a/ckpt")) == Start("refused", None, "/runs/a/ckpt")
    assert refused_line("/r") == "crashdrill: " + refusal("/r")
    assert [resumed_step(t) for t in (resumed_line(150, CKPT), FRESH_LINE)] == [150, 0]
    assert resumed_step(refused_line("/runs/a/ckpt")) is None  # it did not resume at all


def test_a_path_with_spaces_is_read_whole() -> None:
    path = "/home/me/my runs/ckpt/step-00000010"
    assert read_start(resumed_line(10, path)) == Start("resumed", 10, path)


def test_the_first_start_line_counts_among_other_lines_and_prefixes() -> None:
    text = "\n".join(["warming up", f"[rank0]: {resumed_line(40, CKPT)}", FRESH_LINE, "step 41"])
    assert read_start(text) == Start("resumed", 40, CKPT)
    assert read_start(("x\r\n" + FRESH_LINE + "\r\n").encode()) == Start("fresh", 0)
    assert read_start("crashdrill: step 10 loss 2.1\nTraceback (most recent call last):") is None


@pytest.mark.parametrize(
    "cut",
    [
        "crashdrill: resumed at step 15",  # of step 150: the digits are not known to be whole
        "crashdrill: resumed at step 150 from",
        "crashdrill: resumed at step 150 from ",
        "crashdrill: no checkpoint found, starting fre",
        "crashdrill: no checkpoint found in /runs/a/ckpt and --require-checkpoint is se",
    ],
)
def test_a_line_cut_short_is_no_start(cut: str) -> None:
    assert read_start(cut) is None
    assert read_start(cut.encode()) is None
    assert read_start(cut.encode() + b"\n") is None


def test_in_a_byte_stream_only_a_line_with_its_newline_counts() -> None:
    read_so_far = resumed_line(150, CKPT).encode()  # its newline not read yet
    assert read_start(read_so_far) is None
    assert read_start(read_so_far + b"\n") == Start("resumed", 150, CKPT)
    assert read_start(FRESH_LINE.encode()) is None
    assert read_start(FRESH_LINE.encode() + b"\nnext") == Start("fresh", 0)


def test_the_drill_reads_where_a_restart_resumed_from_the_start_line() -> None:
    target = PresetTarget("quick")
    seg = Segment(index=1, argv=[], kill_point=None, started=0.0)
    seg.stderr_head = ["loading", resumed_line(20, CKPT)]
    assert target.resumed_from(seg) == 20
    seg.stderr_head = [FRESH_LINE]
    assert target.resumed_from(seg) == 0
    seg.stderr_head = ["crashdrill: resumed at step 2"]  # the process died mid-line
    assert target.resumed_from(seg) is None


# The line's wording, which only trainer/start_line.py may hold: printed from an f-string,
# parsed with a regex, or the stand-in's own refusal.
HAND_MADE = re.compile(
    r"resumed at step (\{[^}]*\}|\(\\d\+\)) from|starting fresh\"|found, but one"
)


def test_no_module_prints_or_parses_the_start_line_by_hand() -> None:
    places = [ROOT / p for p in ("trainer", "workers", "server", "drill", "crashdrill")]
    places += [ROOT / "benchmarks", ROOT / "tests" / "support"]
    checked = 0
    for place in places:
        for path in place.rglob("*.py"):
            if path.name == "start_line.py":
                continue
            checked += 1
            text = path.read_text()
            assert "crashdrill: resumed at step" not in text, path
            assert "no checkpoint found, starting fresh" not in text, path
            assert not HAND_MADE.search(text), f"{path}: use trainer/start_line.py"
    assert checked > 50  # the walk found the source
