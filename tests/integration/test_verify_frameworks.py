"""`crashdrill verify` and `crashdrill inspect` on tiny real scripts of real frameworks
(tests/integration/frameworks/): a Hugging Face `Trainer`, Lightning, and a 2-rank
torchrun job checkpointing with torch.distributed.checkpoint. Each correct script passes;
each with a planted bug fails naming it, and `inspect` names what its checkpoint lacks.

The HF and Lightning tests need the `frameworks` extra (`pip install -e '.[frameworks]'`):
skipped without it, failing under CI=true (tests/support/extras.py); DCP comes with torch. Each
drill starts the script 3-4 times; each start imports its framework (a few seconds)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.extras import require_extra

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPTS = Path(__file__).with_name("frameworks")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def drill(tmp_path: Path, kills: int, *command: str) -> tuple[int, dict[str, Any], str]:
    out, work = tmp_path / "report.json", tmp_path / "work"
    cmd = [sys.executable, "-m", "crashdrill", "verify", "--json", str(out), "--seed", "1"]
    cmd += ["--kills", str(kills), "--timeout", "240", "--work-dir", str(work), "--", *command]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def inspect(path: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "crashdrill", "inspect", "--json", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def state_missing(rc: int, report: dict[str, Any], out: str) -> str:
    """The text of the drill's state-missing finding (the first, if several resumes have
    one). Other findings may stand beside it: a kill that really tore a checkpoint the
    restart then loaded is also a `torn-checkpoint`, depending on where the kill landed."""
    assert rc == 1, out
    texts = [d["text"] for d in report["diagnosis"] if d["code"] == "state-missing"]
    assert texts, out
    return str(texts[0])


def passed(rc: int, report: dict[str, Any], out: str) -> None:
    assert rc == 0, out
    compared = [r for r in report["resumes"] if r["verdict"] != "nothing left to train"]
    assert compared and all(r["bit_identical"] for r in compared), out


# ---------------------------------------------------------------- Hugging Face Trainer


@pytest.fixture
def hf() -> list[str]:
    require_extra("frameworks")
    return [sys.executable, str(SCRIPTS / "hf_trainer.py")]


def test_a_hugging_face_trainer_script_that_resumes_from_complete_checkpoints_passes(
    hf: list[str], tmp_path: Path
) -> None:
    rc, report, out = drill(tmp_path, 3, *hf)
    passed(rc, report, out)
    inv = inspect(tmp_path / "work" / "crashed")
    assert inv["format"] == "huggingface" and inv["lacks"] == []
    assert inv["parts"]["data"]["status"] == "derived"
    assert inv["rng_streams"] == {"python": 1, "numpy": 1, "torch": 1, "cuda": 0}


def test_a_hugging_face_trainer_saving_only_the_model_fails_naming_the_optimizer(
    hf: list[str], tmp_path: Path
) -> None:
    rc, report, out = drill(tmp_path, 3, *hf, "weights")
    text = state_missing(rc, report, out)
    assert "it lacks optimizer state (momentum or Adam moments, step counts), RNG states" in text
    inv = inspect(tmp_path / "work" / "crashed")
    assert inv["lacks"] == ["optimizer", "rng"]


# ---------------------------------------------------------------- Lightning


@pytest.fixture
def lightning() -> list[str]:
    require_extra("frameworks")
    return [sys.executable, str(SCRIPTS / "lightning_train.py")]


def test_a_lightning_script_with_an_epoch_seeded_sampler_passes(
    lightning: list[str], tmp_path: Path
) -> None:
    rc, report, out = drill(tmp_path, 3, *lightning)
    passed(rc, report, out)
    # A restart that resumed from an older intact last.ckpt skipped nothing incomplete: the
    # note needs a proof that the newer file was incomplete (drill/write_evidence.py)
    proofs = ("cut short", "which", "still held")
    notes = [d for d in report["diagnosis"] if d["code"] == "incomplete-skipped"]
    assert all(any(p in e for p in proofs for e in d["evidence"]) for d in notes), notes
    inv = inspect(tmp_path / "work" / "crashed")
    assert inv["format"] == "lightning" and inv["checkpoint"].endswith("last.ckpt")
    assert inv["lacks"] == ["rng"]  # Lightning saves no RNG state; this script needs none


def test_a_lightning_script_that_shuffles_from_the_global_rng_fails_naming_it(
    lightning: list[str], tmp_path: Path
) -> None:
    rc, report, out = drill(tmp_path, 3, *lightning, "shuffle")
    text = state_missing(rc, report, out)
    assert "the RNG state is not saved" in text and "it lacks RNG states" in text, text


# ---------------------------------------------------------------- torchrun + DCP


@pytest.fixture
def dcp_job() -> list[str]:
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    script = str(SCRIPTS / "dcp_torchrun.py")
    return [torchrun, "--standalone", "--nproc_per_node", "2", script]


def test_a_torchrun_job_checkpointing_with_dcp_passes(dcp_job: list[str], tmp_path: Path) -> None:
    rc, report, out = drill(tmp_path, 2, *dcp_job)
    passed(rc, report, out)
    assert all(k["processes"] >= 3 for k in report["kills"] if k["landed"]), report["kills"]
    inv = inspect(tmp_path / "work" / "crashed")
    assert inv["format"] == "torch.distributed.checkpoint"
    assert inv["parts"]["optimizer"]["status"] == "present"
    assert inv["lacks"] == ["rng", "data"]  # batches are a function of the step: honest, not needed


def test_a_dcp_job_that_saves_only_the_model_fails_naming_the_optimizer(
    dcp_job: list[str], tmp_path: Path
) -> None:
    rc, report, out = drill(tmp_path, 3, *dcp_job, "model")  # a plain kill after a checkpoint
    text = state_missing(rc, report, out)
    assert "optimizer state (momentum" in text and "it lacks optimizer state" in text, text
