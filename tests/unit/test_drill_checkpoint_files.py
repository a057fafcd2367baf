"""Which files of a checkpoint dir the drill takes as checkpoints (drill/checkpoint_files.py):
by content, never the logs or configs beside them; `--checkpoint-glob` instead."""

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
            "model.pt": ZIP,
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


def test_a_checkpoint_s_name_is_not_enough_its_bytes_decide(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "model.pt": b"not a torch file: text a script wrote under a .pt name",
            "weights.bin": struct.pack("<4f", 1.0, 2.0, 3.0, 4.0) * 4,  # tensor.tofile()
            "empty.ckpt": b"",  # torch.save has opened it: a write under way
            "best.pth": pickle.dumps({"w": 1}, protocol=2),
            "arr.npy": b"\x93NUMPY\x01\x00",
            "head.safetensors": SAFETENSORS,
        },
    )
    files = CheckpointFiles()
    assert sorted(files.scan(tmp_path)) == ["arr.npy", "best.pth", "empty.ckpt", "head.safetensors"]
    assert files.ignored["model.pt"].startswith("named .pt, but its bytes are not a checkpoint")
    assert "plain text" in files.ignored["model.pt"]
    assert "raw float32 array" in files.ignored["weights.bin"]
    assert "--checkpoint-glob takes it anyway" in files.ignored["weights.bin"]
    assert files.taken["empty.ckpt"] == "an empty .ckpt: a checkpoint write under way, or torn"
    # A checkpoint rewritten in place is one while it is being written, whatever its bytes.
    (tmp_path / "best.pth").write_bytes(b"{")
    os.utime(tmp_path / "best.pth", ns=(1, 1))
    assert "best.pth" in files.scan(tmp_path)


def test_configs_and_state_written_at_every_start_are_not_checkpoints(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "config.json": b'{"n_layer": 4, "lr": 0.001}',
            "args.json": b'{"resume": true, "epoch": 100, "step": 0}',
            "hparams.json": b'{"epochs": 10}',
            "train_config.json": b'{"iter": 5}',
            "trainer_state.json": b'{"global_step": 0, "log_history": []}',
            "tokenizer.json": b'{"model": {}}',
            "config.json.tmp": b"",
            "ckpt.json": b'{"train_state": {"iter_num": 40}, "w": [0.5]}',
            "ckpt/latest/MANIFEST.json": b'{"step": 40, "files": {}}',
            "ckpt/latest/model.pt": ZIP,
            "ckpt/step-00000040/MANIFEST.json": b'{"step": 40}',
        },
    )
    files = CheckpointFiles()
    assert sorted(files.scan(tmp_path)) == [
        "ckpt.json",
        "ckpt/latest/MANIFEST.json",
        "ckpt/latest/model.pt",
        "ckpt/step-00000040/MANIFEST.json",
    ]
    for name in ("config.json", "args.json", "hparams.json", "train_config.json",
                 "trainer_state.json", "tokenizer.json", "config.json.tmp"):  # fmt: skip
        assert files.ignored[name].startswith("a config by its name"), name
    assert files.taken["ckpt.json"] == (
        "a JSON checkpoint: it holds a training position (train_state.iter_num)"
    )


def test_a_json_rewritten_with_the_position_it_held_is_no_progress(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"step": 0, "started": 1.0}')
    files = CheckpointFiles()
    first = files.scan(tmp_path)
    state.unlink()  # a start that rewrites it (a new file: another inode, mtime and size)
    state.write_text('{"step": 0, "started": 22.5}')
    again = files.scan(tmp_path)
    assert again != first and not files.advanced(first, again)
    state.write_text('{"step": 8, "started": 22.5}')
    os.utime(state, ns=(5, 5))
    later = files.scan(tmp_path)
    assert files.advanced(again, later)
    assert files.advanced({}, first)  # the first one is progress from nothing
    (tmp_path / "model.pt").write_bytes(ZIP)
    assert files.advanced(later, files.scan(tmp_path))


def test_a_json_without_a_position_is_progress_only_when_its_bytes_change(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt.json"
    ckpt.write_text("[4, 0.25]")  # a script's own state as a list: no key names a step
    files = CheckpointFiles()
    first = files.scan(tmp_path)
    ckpt.unlink()
    ckpt.write_text("[4, 0.25]")  # rewritten as it was, at a start
    os.utime(ckpt, ns=(7, 7))
    again = files.scan(tmp_path)
    assert again != first and not files.advanced(first, again)
    ckpt.write_text("[8, 0.125]")
    os.utime(ckpt, ns=(9, 9))
    assert files.advanced(again, files.scan(tmp_path))
    ckpt.write_text('{"w": 0.5, "st')  # a write under way: torn until it ends
    os.utime(ckpt, ns=(11, 11))
    assert "ckpt.json" in files.scan(tmp_path)
    assert files.taken["ckpt.json"].startswith("JSON that does not parse")


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
