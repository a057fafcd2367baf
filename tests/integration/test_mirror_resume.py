"""The real trainer (preset `quick`) under the supervisor, its checkpoints mirrored (a local
directory, and gs:// on the in-process emulator): kill it, wipe its checkpoints, and the
restart pulls the newest mirrored one, verified, and resumes bit-identically. And the lab
puts the mirror's sentence into a run's event log."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from crashdrill.server.lessons.resume_checks import resume_checks
from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.trainer.checkpoint_pause import format_pause, paused_step
from crashdrill.workers.launch import Launch
from crashdrill.workers.mirror import CheckpointMirror
from crashdrill.workers.supervisor import Supervisor
from tests.support.gcs_emulator import BUCKET, gcs_emulator
from tests.support.lab import lab_client
from tests.support.supervising import Changes
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line
    return out


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_a_wiped_run_resumes_from_the_mirror_bit_identically(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gcs_emulator() as host:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        url = str(tmp_path / "mirror") if kind == "local" else f"gs://{BUCKET}/lab"
        run_dir = tmp_path / "runs" / "run1"
        mirror = CheckpointMirror(url, poll_s=0.05)
        mirror.start()
        mirror.watch(run_dir)
        try:
            _train_kill_wipe_resume(run_dir, url)
            mirror.release(run_dir.name)
            wait_until(lambda: not mirror.busy(run_dir.name), "the last upload", 60)
        finally:
            mirror.stop()
    records = jsonl(run_dir / "records.jsonl")
    prefix = str(tmp_path / "mirror") if kind == "local" else url
    (event,) = [r for r in records if r.get("code") == "lost"]
    assert (
        "No checkpoint on this machine; pulled the checkpoint at step 100 from"
        f" {prefix}/run1/step-00000100 (verified), 50 steps back;"
        " restarting the trainer to load it." in event["text"]
    )
    resume = next(r for r in records if r["kind"] == "resume" and r["segment"] == 1)
    assert resume["from_step"] == 100
    steps = [(r["segment"], r["step"], r) for r in records if r["kind"] == "step"]
    (check,) = resume_checks(steps, {1: 100})
    assert check.steps == (101, 150) and check.complete
    assert check.bit_identical is True and check.max_abs_delta == 0.0
    uploads = [r for r in jsonl(run_dir / "mirror.jsonl") if r["kind"] == "mirror"]
    assert uploads[-1]["step"] == 300  # the run's last checkpoint went to the mirror too
    print(f"mirror {kind}: uploads (step, seconds, bytes):")
    print([(u["step"], u["seconds"], u["bytes"]) for u in uploads])


def _train_kill_wipe_resume(run_dir: Path, url: str) -> None:
    # The write of checkpoint 150 is held open, so the run cannot finish before the kill.
    first = Launch(run_dir, "quick", "A", env={PAUSE_ENV: format_pause(150, 120)})
    sup = Supervisor(first, Changes(), poll_s=0.05)
    sup.start()
    stderr = run_dir / "stderr.log"
    wait_until(lambda: paused_step(stderr.read_text()) == 150, "step 150", 120)
    wait_until(
        lambda: any(
            r["kind"] == "mirror" and r["step"] == 100 for r in jsonl(run_dir / "mirror.jsonl")
        ),
        "checkpoint 100 in the mirror",
        120,
    )
    pid = sup.pid
    assert pid is not None
    sup.detach()  # kill it ourselves: the machine is gone, disk and all
    os.killpg(pid, signal.SIGKILL)
    psutil.Process(pid).wait(10)
    shutil.rmtree(run_dir / "ckpt")
    changes = Changes()
    again = Supervisor(Launch(run_dir, "quick", "A"), changes, poll_s=0.05, mirror=url)
    again.resume("The trainer's machine was replaced")
    changes.wait_for("finished", timeout=180)


def test_the_lab_shows_the_mirror_copies_in_the_event_log(tmp_path: Path) -> None:
    with lab_client(tmp_path / "lab") as client:
        pair = client.post("/api/pairs", json={"preset": "quick"}).json()

        def finished() -> bool:
            runs = client.get(f"/api/pairs/{pair['pair']}").json()["runs"]
            return all(r["state"] == "finished" for r in runs)

        wait_until(finished, "both runs to finish", 180)

        def copied(run_id: str) -> list[str]:
            events = client.get(f"/api/runs/{run_id}/events").json()["events"]
            return [e["text"] for e in events if "copied to the mirror" in e["text"]]

        for run in pair["runs"]:

            def last_copied(run_id: str = run["id"]) -> bool:
                return any("Checkpoint step 300" in t for t in copied(run_id))

            wait_until(last_copied, "copy", 120)
            texts = copied(run["id"])
            assert all(t.endswith("(in the background; training didn't wait).") for t in texts)
            kept = sorted(p.name for p in (tmp_path / "lab-mirror" / run["id"]).iterdir())
            assert kept[-1] == "step-00000300" and len(kept) == 2
