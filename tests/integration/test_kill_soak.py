"""The soak at a CI size: benchmarks/kill_soak.py with 10 kills of the quick preset (two of
them inside checkpoint writes) — every resume bit-identical, no record lost or written
twice. ~20 s on an idle machine; the 50-kill figure is in the benchmark's docstring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_soak.py"


def test_ten_kills_of_one_run_lose_no_bit_and_no_record() -> None:
    cmd = [sys.executable, str(SOAK), "--preset", "quick", "--kills", "10", "--seed", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = {  # "records lost           0": the name in 23 columns, then the figure
        line[:23].strip(): line[23:].strip()
        for line in proc.stdout.splitlines()
        if len(line) > 23 and line[0].isalpha()
    }
    assert lines["kills landed"].startswith("10 of 10 planned (2 inside a checkpoint write")
    assert lines["resumes bit-identical"] == "10 of 10"
    for name in ("bits differing", "records lost", "records duplicated", "torn record lines"):
        assert lines[name] == "0", out
