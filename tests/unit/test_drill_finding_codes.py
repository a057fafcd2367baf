"""drill/finding_codes.py against docs/verify.md: every code the drill can report is in the
table its docs anchor names, with the same note/fails, and the tables name no other code;
a finding can only be made with a registered code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashdrill.drill import finding_codes
from crashdrill.drill.finding_codes import CODES, DOCS
from crashdrill.drill.verdicts import Finding
from tests.unit.test_docs import anchors

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / DOCS).read_text(encoding="utf-8")
ROW = re.compile(r"^\| `([a-z-]+)`( \(note\))? \|", re.M)


def section(anchor: str) -> str:
    """The text under the heading whose GitHub id is `anchor`, up to the next heading."""
    parts = re.split(r"^(#+ .+)$", PAGE, flags=re.M)
    for i in range(1, len(parts), 2):
        if anchors(parts[i]) == {anchor}:
            return parts[i + 1]
    raise AssertionError(f"{DOCS} has no heading #{anchor}")


def documented() -> dict[str, bool]:
    """code → documented as a note, over every table an anchor of the registry names."""
    out: dict[str, bool] = {}
    for anchor in {c.anchor for c in CODES.values()}:
        for code, note in ROW.findall(section(anchor)):
            out[code] = bool(note)
    return out


def test_every_registered_code_is_in_the_table_of_its_docs_anchor() -> None:
    missing = [
        f"{c.code} (#{c.anchor})"
        for c in CODES.values()
        if c.code not in dict(ROW.findall(section(c.anchor)))
    ]
    assert not missing, f"not in {DOCS}: {missing}"


def test_the_docs_tables_name_no_code_that_does_not_exist() -> None:
    unknown = sorted(set(documented()) - set(CODES))
    assert not unknown, f"{DOCS} names codes drill/finding_codes.py does not have: {unknown}"


def test_a_note_is_marked_as_a_note_in_the_docs_and_only_a_note() -> None:
    docs = documented()
    wrong = [c.code for c in CODES.values() if c.code in docs and docs[c.code] == c.fails]
    assert not wrong, f"(note) in {DOCS} disagrees with `fails` for {wrong}"


def test_every_code_constant_is_a_registered_code() -> None:
    constants = {
        name: value
        for name, value in vars(finding_codes).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str) and name != "DOCS"
    }
    assert set(constants.values()) == set(CODES)
    assert all(name == value.upper().replace("-", "_") for name, value in constants.items())


def test_a_finding_with_a_code_that_is_not_registered_is_refused() -> None:
    with pytest.raises(ValueError, match="'torn-write' is not registered"):
        Finding("torn-write", "resume 1: …")


def test_a_finding_takes_fails_from_its_code_and_a_note_cannot_be_made_to_fail() -> None:
    assert Finding(finding_codes.KILL_MISSED, "…").fails is False
    assert Finding(finding_codes.STATE_MISSING, "…").fails is True
    with pytest.raises(ValueError, match="is a note"):
        Finding(finding_codes.KILL_MISSED, "…", True)
    assert Finding(finding_codes.REFERENCE_DIVERGED, "…", False).fails is False  # note_when
