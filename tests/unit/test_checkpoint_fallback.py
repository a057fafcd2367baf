"""What a restart says when a checkpoint fails its checks on load (trainer/run_start.py
`find_checkpoint`): it falls back to an older checkpoint only when there is one, and says
"no older checkpoint to fall back to" when there is not (lesson 1.10's torn in-place write
had nothing older, and the log used to promise a fallback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer.exit_codes import EXIT_NO_CHECKPOINT
from crashdrill.trainer.records import RecordWriter
from crashdrill.trainer.run_files import read_records
from crashdrill.trainer.run_start import find_checkpoint, refuse_to_start


def torn(run_dir: Path, step: int) -> None:
    """A checkpoint directory whose write never finished: no manifest."""
    d = layout.ckpt_root(run_dir) / layout.step_dir_name(step)
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"half a file")


def rejected(run_dir: Path) -> list[dict[str, Any]]:
    rec = RecordWriter(run_dir, 1)
    assert find_checkpoint(run_dir, rec) is None
    records, _ = read_records(run_dir / "records.jsonl")
    return [r for r in records if r.get("code") == "ckpt_corrupt"]


def test_a_torn_newest_checkpoint_with_nothing_older_says_there_is_no_fallback(
    tmp_path: Path,
) -> None:
    torn(tmp_path, 200)
    (event,) = rejected(tmp_path)
    assert event["text"].endswith("There is no older checkpoint to fall back to.")
    assert "Falling back" not in event["text"] and "Trying" not in event["text"]
    assert event["fallback_step"] is None


def test_a_torn_newest_checkpoint_names_the_older_one_it_tries_next(tmp_path: Path) -> None:
    torn(tmp_path, 100)
    torn(tmp_path, 200)
    first, second = rejected(tmp_path)
    assert "step-00000200" in first["text"]
    assert first["text"].endswith("Trying the older checkpoint at step 100.")
    assert first["fallback_step"] == 100
    assert second["text"].endswith("There is no older checkpoint to fall back to.")
    assert second["fallback_step"] is None


def test_a_refusal_after_rejected_checkpoints_says_they_failed_their_checks(
    tmp_path: Path,
) -> None:
    torn(tmp_path, 200)
    rec = RecordWriter(tmp_path, 1)
    assert refuse_to_start(tmp_path, rec) == EXIT_NO_CHECKPOINT
    records, _ = read_records(tmp_path / "records.jsonl")
    (event,) = [r for r in records if r.get("code") == "no_checkpoint"]
    assert "passed its checks (1 rejected)" in event["text"]
    assert "no checkpoint found" not in event["text"]  # one was found: it was torn
