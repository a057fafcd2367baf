"""The resume outcomes have one home (trainer/resume_outcome.py): the page's words, the
prediction's choices and the served contract all name its values, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from crashdrill.trainer.prediction import RESUME_CHOICES
from crashdrill.trainer.record_contract import contract_json
from crashdrill.trainer.resume_outcome import HELD, LAB_CHECK, PENDING, ResumeOutcome

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"


def test_every_outcome_has_a_stable_snake_case_value_and_a_meaning() -> None:
    for o in ResumeOutcome:
        assert re.fullmatch(r"[a-z_]+", o.value) and o.meaning, o
    assert not HELD & PENDING and PENDING <= LAB_CHECK


def test_a_prediction_s_resume_choices_are_outcomes() -> None:
    assert set(RESUME_CHOICES) <= {o.value for o in ResumeOutcome}


def test_the_contract_serves_every_outcome() -> None:
    served = contract_json()["resume_outcomes"]
    assert [o["value"] for o in served] == [o.value for o in ResumeOutcome]


def test_the_page_picks_words_only_for_outcomes_the_server_has() -> None:
    text = (STATIC / "lesson.js").read_text()
    table = re.search(r"const OUTCOME_LOOK = \{(.*?)\};", text, re.S)
    assert table, "lesson.js has no OUTCOME_LOOK table"
    looks = set(re.findall(r"^\s*(\w+):", table.group(1), re.M))
    compared = set(re.findall(r'c\.outcome === "(\w+)"', text))
    values = {o.value for o in ResumeOutcome}
    assert looks and compared <= looks <= values, (looks, compared)
    assert looks == {o.value for o in LAB_CHECK}  # every outcome a lab check can have


def test_the_run_contract_page_lists_every_outcome() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "run-contract.md").read_text()
    section = page.split("### The outcome of a resume", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert listed[0] == "outcome" and listed[1:] == [o.value for o in ResumeOutcome]
