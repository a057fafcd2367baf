"""The drill in a test suite: a test fails with the drill's diagnosis, not just "exit 1".

    # conftest.py
    pytest_plugins = ["crashdrill.drill.pytest_plugin"]

    # test_resume.py
    def test_training_resumes_bit_identically(crashdrill_verify):
        crashdrill_verify(["python", "train.py", "--out", "{ckpt_dir}"], kills=3, seed=7)

Without the fixture, in any test runner:

    from crashdrill.drill import assert_resumes_bit_identical
    assert_resumes_bit_identical(["python", "train.py"], kills=2, seed=1)

The fixture keeps both runs' dirs and a JSON report under the test's `tmp_path`
(`crashdrill/`), so a failure can be looked at; the seed in the message replays it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from crashdrill.drill.api import assert_resumes_bit_identical
from crashdrill.drill.verify import DrillResult


@pytest.fixture
def crashdrill_verify(tmp_path: Path) -> Callable[..., DrillResult]:
    """`crashdrill_verify(command, **options)`: assert_resumes_bit_identical with the
    runs' dirs and report.json kept under tmp_path/crashdrill/. Python scripts run with
    this interpreter when the command starts with "python"."""
    calls = {"n": 0}

    def drill(command: Sequence[str] | None = None, **options: Any) -> DrillResult:
        calls["n"] += 1
        root = tmp_path / "crashdrill" / str(calls["n"])
        options.setdefault("work_dir", root / "runs")
        options.setdefault("json_path", root / "report.json")
        root.mkdir(parents=True, exist_ok=True)
        if command is not None and command and command[0] in ("python", "python3"):
            command = [sys.executable, *command[1:]]
        return assert_resumes_bit_identical(command, **options)

    return drill
