"""`crashdrill verify` rank by rank on a torchrun script of this project's own
(tests/integration/research/torchrun_rank_rng.py: 2 gloo ranks on CPU, a DCP checkpoint
with each rank's RNG state beside it, every rank printing its own loss under `--tee 3`):
the correct script passes bit-identically with both ranks' traces compared, and the one
whose rank 1 restores rank 0's RNG fails naming rank 1. Each drill starts torchrun four
times (~30 s on the 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "research" / "torchrun_rank_rng.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--tee", "3"]


def drill(
    tmp_path: Path, *script_args: str, options: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(out), "--seed", "3"]
    cmd += ["--kills", "2", "--timeout", "120", *options, "--"]
    cmd += [*TORCHRUN, "--nproc_per_node", "2", str(SCRIPT), *script_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def test_a_torchrun_script_whose_rank_1_restores_rank_0_s_rng_fails_naming_rank_1(
    tmp_path: Path,
) -> None:
    rc, rep, out = drill(tmp_path, "--flaw", "rank0-rng")
    assert rc == 1, out
    assert rep["ranks"]["mode"] == "every" and rep["ranks"]["ranks"] == [0, 1]
    assert [d["code"] for d in rep["diagnosis"] if d["fails"]] == ["rank-state"], out
    bad = [r for r in rep["resumes"] if not r["bit_identical"]]
    assert bad, out
    rank = bad[0]["first_divergent_rank"]
    assert rank is not None and rank["rank"] == 1 and rank["ranks"] == 2
    assert rank["step"] == bad[0]["first_step"]  # its very first step after the resume
    assert "differs on rank 1 while the other ranks' match" in out
    assert "ranks: 2 ranks compared" in out


def test_the_same_script_restoring_each_rank_s_own_rng_passes_bit_identically(
    tmp_path: Path,
) -> None:
    rc, rep, out = drill(tmp_path)
    assert rc == 0, out
    assert len(rep["resumes"]) == 2 and all(r["bit_identical"] for r in rep["resumes"])
    fields = [f["field"] for f in rep["resumes"][1]["fields"]]
    assert fields == ["step.loss", "step.rank_loss_bits.0", "step.rank_loss_bits.1"]
    assert all(f["equal"] for f in rep["resumes"][1]["fields"])
