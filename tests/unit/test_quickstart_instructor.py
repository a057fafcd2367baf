"""`python3 quickstart.py lab --instructor`: the token is made once in the lab's data
directory, readable by its owner only, and read back on the next start; a token set in
CRASHDRILL_INSTRUCTOR_TOKEN wins and nothing is written."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]


def test_the_instructor_token_is_made_once_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRASHDRILL_INSTRUCTOR_TOKEN", raising=False)
    qs = quickstart()
    first = qs.instructor_token(["--data-dir", str(tmp_path / "lab")])
    path = tmp_path / "lab" / "instructor_token"
    assert path.read_text().strip() == first and len(first) >= 16
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert qs.instructor_token([f"--data-dir={tmp_path / 'lab'}"]) == first


def test_a_token_in_the_environment_wins_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_INSTRUCTOR_TOKEN", "a-token-of-the-operator-1234")
    qs = quickstart()
    assert qs.instructor_token(["--data-dir", str(tmp_path)]) == "a-token-of-the-operator-1234"
    assert not (tmp_path / "instructor_token").exists()


def test_options_are_read_in_both_spellings() -> None:
    qs = quickstart()
    assert qs.option(["--port", "8080"], "--port") == "8080"
    assert qs.option(["--port=9000"], "--port") == "9000"
    assert qs.option(["--host", "0.0.0.0"], "--port") is None


def test_the_token_quickstart_makes_passes_the_lab_s_token_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashdrill.server.settings import token_problem

    monkeypatch.delenv("CRASHDRILL_INSTRUCTOR_TOKEN", raising=False)
    qs = quickstart()
    for n in range(20):
        token = qs.instructor_token(["--data-dir", str(tmp_path / f"lab{n}")])
        assert token_problem(token) is None, token
