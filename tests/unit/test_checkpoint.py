from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer import checkpoint_pause


def _files(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 64, generator=g)},
        "train_state": {"step": step, "rng": torch.get_rng_state(), "n": 3},
    }


def _meta() -> dict:
    return {"parts": list(ck.PARTS_FULL), "fingerprints": {"config": "c"}}


def _save(tmp_path: Path, steps, **kw) -> ck.CheckpointWriter:
    w = ck.CheckpointWriter(tmp_path, **kw)
    for s in steps:
        w.save(s, _files(s), _meta())
    w.wait()
    return w


def test_atomic_write_leaves_manifest_and_no_temp_dirs(tmp_path):
    _save(tmp_path, [0, 10])
    names = sorted(p.name for p in ck.ckpt_root(tmp_path).iterdir())
    assert names == ["step-00000000", "step-00000010"]
    manifest = json.loads((ck.ckpt_root(tmp_path) / "step-00000010" / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "train_state.pt"}
    assert manifest["step"] == 10 and manifest["format"] == ck.FORMAT_VERSION


def test_keeps_only_the_newest_k(tmp_path):
    _save(tmp_path, [0, 10, 20, 30], keep=2)
    assert [c.step for c in layout.checkpoints(tmp_path)] == [30, 20]


def test_load_files_uses_weights_only_and_round_trips(tmp_path):
    _save(tmp_path, [5])
    info = ck.find_latest(tmp_path)
    assert info is not None and info.step == 5
    loaded = ck.load_files(info)
    assert torch.equal(loaded["model"]["w"], _files(5)["model"]["w"])
    assert loaded["train_state"]["n"] == 3


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no_manifest"])
def test_corrupt_latest_falls_back_to_previous_loudly(tmp_path: Path, damage: str) -> None:
    _save(tmp_path, [0, 10])
    latest = ck.ckpt_root(tmp_path) / "step-00000010"
    target = latest / "model.pt"
    if damage == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif damage == "bitflip":
        flipped = bytearray(target.read_bytes())
        flipped[len(flipped) // 2] ^= 0x01
        target.write_bytes(bytes(flipped))
    else:
        (latest / "MANIFEST.json").unlink()
    complaints: list[str] = []
    info = ck.find_latest(tmp_path, on_corrupt=complaints.append)
    assert info is not None and info.step == 0
    assert len(complaints) == 1 and "step-00000010" in complaints[0]


def test_temp_dir_of_an_interrupted_write_never_counts(tmp_path):
    _save(tmp_path, [0])
    tmp = ck.ckpt_root(tmp_path) / "step-00000010.tmp"
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"half")
    assert ck.find_latest(tmp_path).step == 0
    ck.CheckpointWriter(tmp_path)  # a new writer clears leftovers
    assert not tmp.exists()


def test_async_mode_snapshots_before_training_mutates_state(tmp_path):
    w = ck.CheckpointWriter(tmp_path, mode="async")
    files = _files(1)
    original = files["model"]["w"].clone()
    w.save(1, files, _meta())
    files["model"]["w"].add_(1.0)  # training moves on while the thread writes
    w.wait()
    loaded = ck.load_files(ck.find_latest(tmp_path))
    assert torch.equal(loaded["model"]["w"], original)


def test_inplace_mode_uses_one_slot_and_a_torn_write_is_detected(tmp_path):
    _save(tmp_path, [0, 10], write="inplace")
    root = ck.ckpt_root(tmp_path)
    assert [p.name for p in root.iterdir()] == ["latest"]
    assert ck.find_latest(tmp_path).step == 10
    # a crash in the middle of the next in-place write: new bytes, old manifest
    (root / "latest" / "model.pt").write_bytes(b"partial write")
    assert ck.find_latest(tmp_path) is None


def test_pause_hook_holds_the_writer_inside_the_write_of_the_steps_it_names(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(checkpoint_pause.ENV, "7:0.01,9:0.02")
    writer = _save(tmp_path, [7, 8])
    assert writer.pauses == {7: 0.01, 9: 0.02}
    paused = [checkpoint_pause.paused_step(line) for line in capsys.readouterr().err.splitlines()]
    assert paused == [7]  # step 8's write did not pause


def test_an_announcing_writer_says_each_write_s_begin_and_end_and_a_silent_one_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(checkpoint_pause.ANNOUNCE_ENV, "1")
    monkeypatch.setenv(checkpoint_pause.ENV, "8:0.01")
    _save(tmp_path / "said", [7, 8])
    err = capsys.readouterr().err
    assert err.splitlines() == [
        checkpoint_pause.writing_line(7),
        checkpoint_pause.written_line(7),
        checkpoint_pause.writing_line(8),
        checkpoint_pause.paused_line(8),  # the pause is inside the write it holds open
        checkpoint_pause.written_line(8),
    ]
    monkeypatch.delenv(checkpoint_pause.ANNOUNCE_ENV)
    monkeypatch.delenv(checkpoint_pause.ENV)
    _save(tmp_path / "silent", [7])
    assert capsys.readouterr().err == ""


def test_a_malformed_pause_is_refused_when_the_writer_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoint_pause.ENV, "seven:1")
    with pytest.raises(checkpoint_pause.PauseError, match=r"'seven:1'.*STEP:SECONDS"):
        ck.CheckpointWriter(tmp_path)


def test_load_model_state_without_checkpoint_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        ck.load_model_state(tmp_path)


def test_saving_the_same_step_again_replaces_it_whole(tmp_path):
    w = ck.CheckpointWriter(tmp_path)
    w.save(3, _files(3), _meta())
    w.save(3, _files(4), _meta())
    loaded = ck.load_files(ck.find_latest(tmp_path))
    assert torch.equal(loaded["model"]["w"], _files(4)["model"]["w"])
    assert not any(p.name.endswith(".tmp") for p in os.scandir(ck.ckpt_root(tmp_path)))
