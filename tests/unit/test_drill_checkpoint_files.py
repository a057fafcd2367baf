"""Which files of a checkpoint dir the drill takes as checkpoints (drill/checkpoint_files.py):
by name and content, never the logs beside them; `--checkpoint-glob` instead."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import pytest

from crashdrill.drill.checkpoint_files import CheckpointFiles, check_globs

ZIP = b"PK\x03\x04" + b"\0" * 60  # how a torch.save file starts
SAFETENSORS = struct.pack("<Q", 20) + b'{"w": {"dtype": "F32"}}'


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_checkpoints_are_taken_and_the_logs_beside_them_are_ignored(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "model.pt": b"anything: the name says torch.save",
            "weights": ZIP,  # no extension: its first bytes say torch.save
            "state": pickle.dumps({"step": 3}, protocol=4),
            "head.safetensors": SAFETENSORS,
            "ckpt.json": b'{"step": 3}',
            "state.json": b'{"step": 3, "w": 0.5}',  # "state" is no "stats" log
            "run_stats.json": b'{"loss": 1.0}',
            "checkpoint-200/trainer_state.json": b"{}",
            "checkpoint-200/vocab.txt": b"a b c",
            "dcp/.metadata": b"\x80\x04",
            "dcp/__0_0.distcp": b"\0",
            "lightning_logs/version_0/checkpoints/last.ckpt": ZIP,
            "events.out.tfevents.1700000000.host.1": b"\x18\0\0\0",
            "log.csv": b"1,2.0\n",
            "metrics.json": b'{"loss": 1.0}',
            "samples/step-10.txt": b"hello",
            "runs/Dec03/events.out.tfevents.1.host.2": b"\0",
            "lightning_logs/version_0/metrics.csv": b"step,loss\n",
            "lightning_logs/version_0/hparams.yaml": b"lr: 1\n",
            "wandb/run-1/files/wandb-summary.json": b"{}",
            "wandb/run-1/tmp/code/train.py": b"print()",
            "notes": b"plain text, no format",
        },
    )
    files = CheckpointFiles()
    assert sorted(files.scan(tmp_path)) == [
        "checkpoint-200/trainer_state.json",
        "checkpoint-200/vocab.txt",
        "ckpt.json",
        "dcp/.metadata",
        "dcp/__0_0.distcp",
        "head.safetensors",
        "lightning_logs/version_0/checkpoints/last.ckpt",
        "model.pt",
        "state",
        "state.json",
        "weights",
    ]
    assert files.ignored["run_stats.json"] == "a JSON log by its name"
    assert files.ignored["events.out.tfevents.1700000000.host.1"] == "a TensorBoard event log"
    assert files.ignored["log.csv"] == "a log or text file (.csv)"
    assert files.ignored["metrics.json"] == "a JSON log by its name"
    assert files.ignored["notes"].startswith("not a checkpoint format")
    assert files.ignored["wandb/run-1/tmp/code/train.py"].startswith("under wandb/")
    assert files.taken["weights"].startswith("a zip file")
    assert files.taken["checkpoint-200/vocab.txt"] == "in the checkpoint dir checkpoint-200/"


def test_temp_files_of_a_write_stay_but_a_log_s_temp_file_does_not(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "model.pt.tmp": b"",  # a write begun: nothing in it yet
            "tmpa1b2c3": b"PK",  # tempfile.NamedTemporaryFile(dir=...)
            "step-00000020.tmp/model.pt": b"",
            "metrics.csv.tmp": b"1,2\n",
            "runs/x.tmp": b"",
        },
    )
    files = CheckpointFiles()
    snap = files.scan(tmp_path)
    assert sorted(snap) == ["model.pt.tmp", "step-00000020.tmp/model.pt", "tmpa1b2c3"]
    assert files.temps == set(snap) and not files.taken
    assert set(files.ignored) == {"metrics.csv.tmp", "runs/x.tmp"}


def test_a_file_is_judged_again_when_it_changes_and_not_read_again_when_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"")  # an empty file of unknown name: not a checkpoint yet
    files = CheckpointFiles()
    assert files.scan(tmp_path) == {}
    reads: list[str] = []
    real_open = open

    def counting_open(p: object, *a: object, **k: object) -> object:
        reads.append(str(p))
        return real_open(p, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(5):
        assert files.scan(tmp_path) == {}
    assert reads == []  # cached by (inode, size, mtime)
    monkeypatch.undo()
    path.write_bytes(ZIP)
    os.utime(path, ns=(1, 1))
    assert list(files.scan(tmp_path)) == ["blob"] and "blob" not in files.ignored


def test_globs_replace_the_recognition(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "model.pt": ZIP,
            "best/weights.npz": ZIP,
            "best/weights.npz.tmp": b"",
            "state.dat": b"raw",
            "ckpt-3/a": b"x",
            "tmpxyz": b"",
        },
    )
    files = CheckpointFiles(["state.dat", "ckpt-*", "best/*.npz"])
    assert sorted(files.scan(tmp_path)) == [
        "best/weights.npz",
        "best/weights.npz.tmp",  # its temp file: the glob matches without `.tmp`
        "ckpt-3/a",  # a folder's pattern takes what is in it
        "state.dat",
    ]
    assert files.ignored["model.pt"] == "matches no --checkpoint-glob"
    assert files.ignored["tmpxyz"] == "matches no --checkpoint-glob"
    assert files.to_json()["globs"] == ["state.dat", "ckpt-*", "best/*.npz"]


@pytest.mark.parametrize("bad", ["", "/abs/model.pt", "../model.pt", "a/../../b"])
def test_a_glob_outside_the_checkpoint_dir_is_refused_with_what_is_allowed(bad: str) -> None:
    with pytest.raises(ValueError, match="relative to the checkpoint dir"):
        check_globs([bad])
