"""The --jsonl stdout line the drill reads has one writer (trainer/loop.py print_loss_line):
a run of several ranks adds its ranks' bits to the same line instead of writing its own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from crashdrill.trainer.loop import print_loss_line
from crashdrill.trainer.records import float32_bits

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


def test_the_line_says_step_loss_its_bits_and_segment(capsys: pytest.CaptureFixture[str]) -> None:
    print_loss_line(300, 2.5, 1)
    line = capsys.readouterr().out
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == {
        "step": 300,
        "loss": 2.5,
        "loss_bits": float32_bits(2.5),
        "segment": 1,
    }


def test_a_run_of_ranks_adds_their_bits_to_the_same_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_loss_line(7, 3.0, 0, rank_loss_bits={"0": 1, "1": 2})
    line = json.loads(capsys.readouterr().out)
    assert list(line) == ["step", "loss", "loss_bits", "rank_loss_bits", "segment"]
    assert line["rank_loss_bits"] == {"0": 1, "1": 2}


def test_no_other_trainer_module_writes_a_loss_line_of_its_own() -> None:
    # A line of JSON on stdout that names loss_bits: the shape of the one line.
    own_line = re.compile(r"sys\.stdout\.write\(|\"loss_bits\":")
    found = [
        p.name
        for p in sorted(TRAINER.rglob("*.py"))
        if p.name != "loop.py" and own_line.search(p.read_text(encoding="utf-8"))
    ]
    assert found == [], f"write the --jsonl line with trainer/loop.py print_loss_line: {found}"
