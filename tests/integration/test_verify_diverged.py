"""`crashdrill verify --preset FILE.toml` on a built-in trainer that diverges (exit 4):
settings that blow up in a few steps (lr 1.0, no warmup, weight decay 10, no clipping to
speak of: benchmarks/abuse.py's), real trainer processes, real SIGKILL."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DIVERGING = """\
id = "drill-diverge"
title = "Drill test: settings that diverge"
[run]
n_layer = 2
d_model = 64
n_head = 4
ctx = 32
batch = 4
steps = 60
warmup = 0
lr = 1.0
weight_decay = 10.0
grad_clip = 1000.0
ckpt_every = 15
eval_every = 1000
probe_every = 1000
sample_every = 1000
threads = 1
[knob]
name = "ckpt_every"
a = 15
b = 30
"""


def drill(
    tmp_path: Path, seed: int, ckpt_every: int = 15
) -> tuple[int, dict[str, Any], str, ET.Element]:
    """The drill of run A, checkpointing every `ckpt_every` steps: the first kill lands in
    the first quarter of the steps before its first checkpoint (drill/plan.py)."""
    preset = tmp_path / "diverge.toml"
    preset.write_text(DIVERGING.replace("a = 15", f"a = {ckpt_every}"))
    out, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    args = ["--preset", str(preset), "--kills", "2", "--seed", str(seed)]
    proc = run_cli("verify", *args, "--json", str(out), "--junit", str(junit), timeout=110)
    assert out.is_file(), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout, ET.parse(junit).getroot()


def _diverged_step(rep: dict[str, Any]) -> int:
    assert rep["reference"]["exit_code"] == 4, rep["reference"]  # EXIT_DIVERGED
    return int(rep["reference"]["last_step"])


def test_a_reference_that_diverges_before_any_kill_is_bad_input(tmp_path: Path) -> None:
    # It diverges at step 9; with one checkpoint, at 60, seed 2's first kill is planned at 14
    rc, rep, out, junit = drill(tmp_path, seed=2, ckpt_every=60)
    step = _diverged_step(rep)
    assert all(k["planned_step"] > step for k in rep["kills"]), "a kill landed before it"
    assert rc == 2 and rep["exit_code"] == 2 and rep["verdict"] == "fail", out
    assert [d["code"] for d in rep["diagnosis"]] == ["reference-diverged"]
    said = f"the reference run (no kills) diverged at step {step}: the "
    assert said in rep["diagnosis"][0]["text"] and said in out
    assert "fix the settings before drilling resumes" in out and "ERROR" in out
    (case,) = junit.iter("testcase")
    failure = case.find("failure")
    assert failure is not None and said in (failure.text or "")


def test_a_resume_before_the_divergence_diverges_the_same_way_and_passes(
    tmp_path: Path,
) -> None:
    rc, rep, out, junit = drill(tmp_path, seed=1)  # seed 1: the first kill is planned at 1
    step = _diverged_step(rep)
    (resume,) = rep["resumes"]
    assert resume["killed_at_step"] < step, "the kill landed after the divergence"
    assert rc == 0 and rep["verdict"] == "pass", out
    assert resume["bit_identical"] and resume["outcome"] == "diverged (exit 4)"
    assert resume["points"] == step  # resumed from step 0: every step up to the divergence
    (note,) = rep["diagnosis"]
    assert note["code"] == "reference-diverged" and not note["fails"]
    assert not [c for c in junit.iter("testcase") if c.find("failure") is not None]
