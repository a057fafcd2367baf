"""Every planned trial is exercised (issue 33 §4): kills placed from the reference's
observed checkpoint writes, trials labelled by what happened, and a recovery replay that
starts from the dir as it was just before the torn write.

Two scripts of tests/integration/research/:

- plan_late_ckpt.py: correct, 60 steps, checkpoints only after steps 36, 44 and 53. The
  spread plan put the plain kill anywhere in the run, and on seeds 0 and 2 before the
  first checkpoint (while the JSON labelled it "after-checkpoint"): no plain resume was
  tested.
- plan_torn_inplace.py: 240 steps, one `ckpt.json` rewritten in place every 40 steps, so
  a kill inside a write tears it and the restart crashes. The replay after it used to
  start from the dir as the killed process had found it (empty: it started after a kill
  before the first checkpoint) and retrain every step from 1.

Real processes, real SIGKILL; pure Python.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]

RESEARCH = Path(__file__).resolve().parent / "research"


def verify(script: str, tmp_path: Path, *opts: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(out), *opts]
    cmd += ["--", sys.executable, str(RESEARCH / script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


@pytest.mark.parametrize("seed", [0, 2])
def test_late_irregular_checkpoints_get_a_real_plain_resume_after_one(
    tmp_path: Path, seed: int
) -> None:
    rc, rep, out = verify("plan_late_ckpt.py", tmp_path, "--seed", str(seed), "--kills", "3")
    assert rc == 0, out
    plain = [k for k in rep["kills"] if k["planned"] == "after-checkpoint"]
    assert len(plain) == 1 and plain[0]["planned_step"] > 36, rep["kills"]
    assert plain[0]["landed"] and plain[0]["kind"] == "after-checkpoint", plain
    (resume,) = [r for r in rep["resumes"] if r["kill"] == plain[0]["index"]]
    # resumed from a complete checkpoint and recomputed the steps after it
    assert resume["trial"] == "after-checkpoint" and resume["from_step"] in (36, 44, 53)
    assert resume["recomputed"] and resume["recomputed"]["steps"] >= 1, resume
    # no kill is called "after a checkpoint" that landed before the first one
    for k in rep["kills"]:
        assert k["kind"] != "after-checkpoint" or k["step"] > 36, k
    assert any(t["kind"] == "after-checkpoint" and t["passed"] for t in rep["trials"]), out


def test_a_replay_after_a_torn_write_recomputes_only_the_steps_since_the_write_before(
    tmp_path: Path,
) -> None:
    rc, rep, out = verify("plan_torn_inplace.py", tmp_path, "--seed", "1")
    assert rc == 1 and {d["code"] for d in rep["diagnosis"] if d["fails"]} == {"torn-checkpoint"}, (
        out
    )
    (aimed,) = [k for k in rep["kills"] if k["planned"] == "inside-write"]
    assert aimed["kind"] == "inside-write" and aimed["planned_step"] in (80, 120, 160, 200)
    (replay,) = [r for r in rep["resumes"] if r["replay_of"] is not None]
    before = aimed["planned_step"] - 40  # the write before the torn one
    assert replay["from_step"] == before and replay["first_step"] == before + 1, replay
    # it recomputes what the killed process printed since that write: about 40 steps, not
    # every step from 1 (the copy used to be the dir as the killed process started)
    assert replay["recomputed"]["first"] == before + 1, replay
    assert replay["recomputed"]["steps"] <= 42 and replay["bit_identical"], replay
    took = re.search(r"put back as it was at step (\d+) of resume", out)
    assert took and before < int(took[1]) < aimed["planned_step"], out  # taken between writes
    recovery = [k for k in rep["kills"] if k["recovery"]]
    assert recovery and recovery[0]["kind"] == "after-checkpoint" and recovery[0]["landed"]
