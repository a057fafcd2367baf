"""`crashdrill verify -- COMMAND` names each bug truthfully, with evidence (issue 33 §3), on
research-style torch scripts of tests/integration/research/: state saved but not
restored, a weights-only save whose restart counts steps from 1 again, and checkpoint-N/
dirs written in place that a drill without a kill inside a write passes — with a note
naming the trial that would catch it. Each drill starts its script 3-4 times (torch's
import each time: a few seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIPTS = Path(__file__).with_name("research")


def drill(
    script: str, tmp_path: Path, *opts: str, args: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "crashdrill", "verify", "--json", str(out), *opts]
    cmd += ["--", sys.executable, str(SCRIPTS / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def failing(report: dict[str, Any]) -> list[str]:
    return [d["code"] for d in report["diagnosis"] if d["fails"]]


def test_rng_state_saved_but_not_restored_is_said_so_not_that_the_file_lacks_it(
    tmp_path: Path,
) -> None:
    rc, rep, out = drill("diag_saved_not_restored.py", tmp_path, "--seed", "1", "--kills", "2")
    assert rc == 1 and failing(rep) == ["saved-not-restored"], out
    text = next(d["text"] for d in rep["diagnosis"] if d["code"] == "saved-not-restored")
    assert "saved but not restored" in text and "finds RNG states (torch CPU" in text, text
    assert "optimizer state (Adam-style" in text and "lacks" not in text, text


def test_the_same_trainer_restoring_its_rng_state_too_passes(tmp_path: Path) -> None:
    rc, rep, out = drill(
        "diag_saved_not_restored.py", tmp_path, "--seed", "1", "--kills", "2", args=("full",)
    )
    assert rc == 0 and rep["verdict"] == "pass", out
    assert failing(rep) == [] and len(rep["resumes"]) == 2, out
    assert all(r["bit_identical"] for r in rep["resumes"]), out


def test_a_weights_only_restart_that_counts_from_1_again_is_named_with_the_optimizer(
    tmp_path: Path,
) -> None:
    rc, rep, out = drill("diag_weights_only.py", tmp_path, "--seed", "1", "--kills", "2")
    assert rc == 1 and failing(rep) == ["steps-restarted"], out
    f = next(d for d in rep["diagnosis"] if d["code"] == "steps-restarted")
    assert "it loaded the weights and started counting steps from 1 again" in f["text"], out
    assert "it lacks optimizer state (momentum or Adam moments, step counts), RNG" in f["text"]
    assert any("printed step 1 again with loss" in e for e in f["evidence"]), f
    assert "silent-fresh-start" not in failing(rep)


def test_checkpoint_dirs_written_in_place_pass_one_kill_with_a_note_naming_the_trial(
    tmp_path: Path,
) -> None:
    rc, rep, out = drill("diag_hf_inplace.py", tmp_path, "--seed", "1", "--kills", "1")
    assert rc == 0 and rep["verdict"] == "pass", out
    notes = [d for d in rep["diagnosis"] if d["code"] == "non-atomic-write"]
    assert notes and not notes[0]["fails"], out
    assert "rerun with --kills 2 or more" in notes[0]["text"], notes[0]
    assert any(
        "checkpoint-0008/ was filled in under its final name" in e for e in notes[0]["evidence"]
    )
    assert "[non-atomic-write]" in out
