"""One checkpoint layout (trainer/checkpoint_layout.py): every reader of a run dir's
checkpoints (the trainer, the run dir, the supervisor, the mirror, the mirror's restore,
the drill) agrees which one is the newest complete one, on the names and manifests that
their old patterns (`step-(\\d+)`, `\\d{8,}`, `step-(\\d{8})/`, `isdigit()`) read
differently."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crashdrill.drill.builtin import PresetTarget
from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.workers.launch import Launch
from crashdrill.workers.mirror import newest_local, restore_latest
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor
from tests.support.supervising import Changes, records

pytestmark = pytest.mark.timeout(60)

NEWEST = 100_000_000  # nine digits: the trainer's name once a step reaches 10^8


def write_checkpoint(path: Path, step: int, *, manifest_step: int | None = None) -> Path:
    """A checkpoint directory as the trainer writes it: its files, then MANIFEST.json
    with each file's size and sha256."""
    path.mkdir(parents=True)
    files: dict[str, Any] = {}
    for name in ("model.pt", "train_state.pt"):
        data = os.urandom(256)
        (path / name).write_bytes(data)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    step = step if manifest_step is None else manifest_step
    manifest = {"format": 1, "step": step, "files": files, "created": time.time()}
    (path / layout.MANIFEST).write_text(json.dumps(manifest))
    return path


def disputed_run(run: Path) -> Path:
    """A run dir holding every case the old readers disagreed on; the newest complete
    checkpoint in it is step NEWEST."""
    root = layout.ckpt_root(run)
    write_checkpoint(root / "step-00000000", 0)
    write_checkpoint(root / "step-00000007", 7)
    write_checkpoint(root / "latest", 9)  # the in-place slot, at the step its manifest names
    write_checkpoint(root / "step-7", 7)  # not the trainer's name for step 7
    write_checkpoint(root / "step-12abc", 12)
    write_checkpoint(root / f"step-{NEWEST}", NEWEST)
    write_checkpoint(root / "step-000000123456789", 123456789)  # padded past 8 digits
    arabic_indic = "".join(chr(0x660 + int(c)) for c in str(200_000_000))
    write_checkpoint(root / f"step-{arabic_indic}", 200_000_000)  # \d and int() take these
    gone = write_checkpoint(root / "step-300000000", 300_000_000)
    (gone / layout.MANIFEST).unlink()  # killed between the rename and the manifest
    torn = write_checkpoint(root / "step-400000000", 400_000_000)
    (torn / layout.MANIFEST).write_text((torn / layout.MANIFEST).read_text()[:40])
    write_checkpoint(root / "step-500000000", 500_000_000, manifest_step=5)  # another's
    write_checkpoint(root / "step-600000000.tmp", 600_000_000)  # a write in progress
    return run


def supervisor_resumes_from(run: Path) -> object:
    """The step the supervisor's restart event says it resumes from (its trainer here
    is a command that exits at once)."""
    changes = Changes()
    launch = Launch(run, "quick", "A", command=(sys.executable, "-c", ""))
    Supervisor(launch, changes, poll_s=0.05).resume("The machine was replaced")
    changes.wait_for("finished")
    (event,) = [r for r in records(RunDir(run)) if r.get("code") == "lost"]
    return event["resume_from"]


def test_every_reader_finds_the_same_newest_checkpoint_where_the_old_patterns_disagreed(
    tmp_path: Path,
) -> None:
    run = disputed_run(tmp_path / "run1")
    newest = layout.ckpt_root(run) / layout.step_dir_name(NEWEST)

    trainer = ck.find_latest(run)  # what the training loop resumes from
    assert trainer is not None and (trainer.step, trainer.path) == (NEWEST, newest)
    assert RunDir(run).latest_checkpoint_step() == NEWEST
    local = newest_local(run)
    assert local is not None and (local.step, local.path) == (NEWEST, newest)
    assert supervisor_resumes_from(run) == NEWEST

    mirror = tmp_path / "mirror"
    shutil.copytree(layout.ckpt_root(run), mirror / run.name)  # the same names, mirrored
    rejected: list[str] = []
    restored = restore_latest(
        str(mirror), tmp_path / "elsewhere" / run.name, on_rejected=rejected.append
    )
    assert restored is not None and restored.step == NEWEST
    assert [r.split(" at ")[0] for r in rejected] == [
        "the copy of step 500000000",  # its manifest is step 5's
        "the copy of step 400000000",  # its manifest is torn
    ]
    pulled = ck.find_latest(restored.path.parent.parent)
    assert pulled is not None and pulled.step == NEWEST


@pytest.mark.parametrize(
    ("dirs", "saved"),
    [
        ({"step-00000000": 0, "step-7": 7, "step-000000123456789": 123456789}, False),
        ({"step-00000000": 0, "step-12abc": 12, "step-00000010.tmp": 10}, False),
        ({"step-00000000": 0, f"step-{NEWEST}": NEWEST}, True),
        ({"step-00000000": 0, "latest": 10}, True),
    ],
)
def test_the_drill_counts_saved_progress_by_the_same_names(
    tmp_path: Path, dirs: dict[str, int], saved: bool
) -> None:
    # The drill sees names and file stats (snapshots), not contents: it agrees with the
    # trainer on every name, and a manifest is the file that makes a directory count.
    run = tmp_path / "run"
    for name, step in dirs.items():
        write_checkpoint(layout.ckpt_root(run) / name, step)
    target = PresetTarget("quick")
    snap = target.snapshot(run)
    found = ck.find_latest(run)
    assert found is not None and target.has_checkpoint(snap)
    assert target.progress_saved({}, snap) is saved
    assert (found.step > 0) is saved


def test_the_in_place_slot_is_read_by_every_reader_except_the_mirror(tmp_path: Path) -> None:
    # What ckpt_write = "inplace" leaves: one slot, overwritten in place, never copied.
    run = tmp_path / "run1"
    write_checkpoint(layout.ckpt_root(run) / layout.INPLACE_SLOT, 9)
    trainer = ck.find_latest(run)
    assert trainer is not None and trainer.step == 9
    assert RunDir(run).latest_checkpoint_step() == 9
    assert supervisor_resumes_from(run) == 9
    assert newest_local(run) is None


def test_a_manifest_that_lists_no_files_counts_only_for_the_readers_that_stop_at_it(
    tmp_path: Path,
) -> None:
    path = layout.ckpt_root(tmp_path) / layout.step_dir_name(20)
    path.mkdir(parents=True)
    (path / layout.MANIFEST).write_text('{"step": 20}')
    found = layout.find_latest(tmp_path, check="manifest")
    assert found is not None and found.step == 20
    assert layout.find_latest(tmp_path, check="listed") is None
    complaints: list[str] = []
    assert layout.find_latest(tmp_path, on_corrupt=complaints.append) is None
    assert complaints == ["step-00000020: format None, this crashdrill reads 1"]


@pytest.mark.parametrize("step", [0, 7, 10**8 - 1, 10**8, 10**12])
def test_a_step_directory_name_parses_back_to_its_step(step: int) -> None:
    assert layout.parse_step_dir(layout.step_dir_name(step)) == step


@pytest.mark.parametrize(
    "name",
    [
        "step-7",
        "step-000000007",
        "step-000000123456789",
        "step-12abc",
        "step-00000007.tmp",
        "step-٠٠٠٠٠٠٠٧",
        "step-+0000007",
        "step- 0000007",
        "Step-00000007",
        "latest",
        "step-",
    ],
)
def test_a_name_the_trainer_never_writes_is_not_a_checkpoint(name: str) -> None:
    assert layout.parse_step_dir(name) is None
    assert layout.manifest_owner(f"{name}/{layout.MANIFEST}") == (
        name if name == layout.INPLACE_SLOT else None
    )


def test_the_layout_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "import crashdrill.trainer.checkpoint_layout, crashdrill.workers.run_dir\n"
        "import crashdrill.workers.supervisor\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_part_is_named_in_words_and_one_rank_s_own_part_says_whose() -> None:
    part_description, rank_part = layout.part_description, layout.rank_part
    assert part_description("optimizer") == "AdamW state (moments and step counts)"
    assert part_description(rank_part(1, "rng")) == "rank 1's RNG states"
    assert part_description("rank12.data") == "rank 12's data position"
    assert part_description("rank1.nonsense") == "rank1.nonsense"  # unknown: its own name
