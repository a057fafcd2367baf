"""The supervisor's restart hook: no checkpoint on the machine → pull the newest mirrored
copy that verifies, say so, and resume from it (against the stand-in trainer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from crashdrill.workers.launch import Launch
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.support.extras import require_extra
from tests.support.gcs_emulator import BUCKET, free_port, write_checkpoint
from tests.support.lab import STAND_IN
from tests.support.supervising import Changes, records

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEPS", "40")
    monkeypatch.setenv("CRASHDRILL_STANDIN_STEP_S", "0.01")
    monkeypatch.setenv("CRASHDRILL_STANDIN_CKPT_EVERY", "10")
    return monkeypatch


def a_run_that_lost_its_disk(tmp_path: Path, at_step: int) -> RunDir:
    """A run dir whose first segment trained to `at_step`, with no checkpoint left."""
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    (rd.path / "run.json").write_text(json.dumps({"starts": 1}))
    rd.append_records([{"kind": "step", "segment": 0, "step": at_step, "loss": 1.0}])
    return rd


def mirror_with(tmp_path: Path, steps: tuple[int, ...]) -> Path:
    root = tmp_path / "mirror"
    for step in steps:
        src = write_checkpoint(tmp_path / "elsewhere", step)
        shutil.copytree(src, root / "run" / src.name)
    return root


def restart(rd: RunDir, mirror: str) -> list[dict[str, object]]:
    changes = Changes()
    launch = Launch(rd.path, "quick", "A", command=STAND_IN)
    sup = Supervisor(launch, changes, poll_s=0.05, mirror=mirror)
    sup.resume("The machine was replaced")
    changes.wait_for("finished")
    return records(rd)


def test_a_restart_without_a_checkpoint_pulls_the_newest_copy_that_verifies(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    root = mirror_with(tmp_path, (10, 20))
    (root / "run" / "step-00000020" / "model.pt").write_bytes(b"\0" * 4096)  # bit rot
    rd = a_run_that_lost_its_disk(tmp_path, at_step=25)
    recs = restart(rd, str(root))
    (rejected,) = [r for r in recs if r.get("code") == "mirror_rejected"]
    assert rejected["level"] == "warn"
    assert "step 20" in str(rejected["text"]) and "model.pt" in str(rejected["text"])
    (event,) = [r for r in recs if r.get("code") == "lost"]
    assert str(event["text"]).endswith(
        "No checkpoint on this machine; pulled the checkpoint at step 10 from"
        f" {root}/run/step-00000010 (verified), 15 steps back; restarting the trainer to load it."
    )
    resume = next(r for r in recs if r["kind"] == "resume")
    assert resume["from_step"] == 10 and resume["segment"] == 1
    assert recs.index(rejected) < recs.index(event) < recs.index(resume)


def test_a_restart_with_a_checkpoint_on_disk_does_not_touch_the_mirror(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    root = mirror_with(tmp_path, (10,))
    rd = a_run_that_lost_its_disk(tmp_path, at_step=25)
    (rd.path / "ckpt" / "step-00000020").mkdir(parents=True)
    (rd.path / "ckpt" / "step-00000020" / "MANIFEST.json").write_text('{"step": 20}')
    recs = restart(rd, str(root))
    (event,) = [r for r in recs if r.get("code") == "lost"]
    assert "The newest checkpoint on its disk is at step 20, 5 steps back;" in str(event["text"])
    assert not (rd.path / "ckpt" / "step-00000010").exists()


def test_an_unreachable_mirror_is_said_and_the_restart_goes_on_without_it(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    require_extra("gcs")
    env.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    rd = a_run_that_lost_its_disk(tmp_path, at_step=25)
    recs = restart(rd, f"gs://{BUCKET}/lab")
    (warning,) = [r for r in recs if r.get("code") == "mirror_unreachable"]
    assert warning["level"] == "warn"
    assert str(warning["text"]).startswith(
        f"No checkpoint on this machine, and the mirror gs://{BUCKET}/lab failed: listing"
    )
    assert "network: cannot reach" in str(warning["text"])
    assert not any(r["kind"] == "resume" and r.get("from_step") for r in recs)
