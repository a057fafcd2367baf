"""How a multi-rank checkpoint's state comes back from DCP (trainer/dcp_checkpoint.py): every
value, each under its own name in the index (what `crashdrill inspect` reads), DCP's index
unpickled once, and the short-lived layout that packed the values per key refused. DCP runs
here in one process, without a process group (it warns so; the real groups are in
tests/integration/test_ranks.py)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from crashdrill.trainer import dcp_checkpoint as dc
from crashdrill.trainer.checkpoint_layout import CheckpointInfo
from crashdrill.trainer.file_primitives import sha256_of
from crashdrill.trainer.train_state import CheckpointMismatch


def _state(step: int) -> dict[str, Any]:
    """A rank's state in the trainer's keys, with values that differ with `step`."""
    return {
        "model": {"w": torch.full((3, 2), float(step)), "b": torch.arange(2.0) + step},
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step))}},
            "param_groups": [{"lr": 1e-3 * step, "betas": (0.9, 0.95), "params": [0]}],
        },
        "train_state": {
            "step": step,
            "best_val": None,
            "loss_window": [2.5, 2.25 + step],
            "fingerprints": {"config": f"c{step}"},
        },
        "rank0": {
            "rng": {"python": {"version": 3, "gauss": None}},
            "data": {"samples_consumed": 4 * step, "rank": 0, "world": 2},
        },
    }


def _save(
    where: Path, state: dict[str, Any], planner: Any, tensors: str = dc.TORCH_SAVE
) -> CheckpointInfo:
    """Saved as the trainer's writer does (`tensors` = safetensors), or as FileSystemWriter's
    default did before, with a manifest that names no tensor format."""
    writer, fmt = dc.shard_writer(where)
    if tensors == dc.TORCH_SAVE:
        writer = dcp.FileSystemWriter(str(where))
    else:
        assert fmt == tensors
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is ", UserWarning)  # one process
        dcp.save(state, storage_writer=writer, planner=planner)
    files = {}
    for p in where.iterdir():
        with open(p, "rb") as f:
            files[p.name] = {"sha256": sha256_of(f), "bytes": p.stat().st_size}
    manifest = {"layout": dc.DCP_LAYOUT, "world_size": 2, "files": files}
    if tensors != dc.TORCH_SAVE:
        manifest[dc.TENSOR_FORMAT] = tensors
    return CheckpointInfo(step=0, path=where, manifest=manifest)


def _load(info: CheckpointInfo, into: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is ", UserWarning)
        dc.load_group(info, None, into)  # no group: one process
    return into


def _index_keys(info: CheckpointInfo) -> set[str]:
    return set(dcp.FileSystemReader(str(info.path)).read_metadata().state_dict_metadata)


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert torch.equal(got["model"]["w"], want["model"]["w"])
    assert torch.equal(got["optimizer"]["state"][0]["step"], want["optimizer"]["state"][0]["step"])
    for key in ("train_state", "rank0"):
        assert got[key] == want[key]
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert got["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)  # a tuple stays one


@pytest.mark.parametrize("tensors", [dc.SAFETENSORS, dc.TORCH_SAVE])
def test_every_value_is_an_item_under_its_own_name_and_loads_back(
    tmp_path: Path, tensors: str
) -> None:
    info = _save(tmp_path / "ck", _state(7), None, tensors)
    keys = _index_keys(info)
    assert {"train_state.step", "optimizer.param_groups.0.lr", "rank0.data.world"} <= keys
    assert dc.held_ranks(info) == {0}
    _assert_same(_load(info, _state(1)), _state(7))


def test_a_checkpoint_of_values_packed_per_key_is_refused_naming_a_fresh_run_dir(
    tmp_path: Path,
) -> None:
    packed = {"model": _state(7)["model"], "train_state._values": [["train_state.step", 7]]}
    info = _save(tmp_path / "ck", packed, None)
    with pytest.raises(CheckpointMismatch, match="fresh --run-dir"):
        _load(info, _state(1))


def test_dcp_s_index_is_unpickled_once_for_held_ranks_and_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = _save(tmp_path / "ck", _state(7), None)
    reads: list[str] = []
    real = dcp.FileSystemReader.read_metadata

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(self.path))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(dcp.FileSystemReader, "read_metadata", counted)
    dc._index.cache_clear()
    dc.held_ranks(info)
    dc.held_ranks(info)
    _load(info, _state(1))
    assert len(reads) == 1


def test_safetensors_shards_are_read_once_each_and_never_through_torch_load_per_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of the format: a tensor is not a torch.load of its own (0.4 ms apiece)."""
    state = _state(7)
    state["model"].update({f"layer{i}": torch.randn(4, 4) for i in range(20)})
    info = _save(tmp_path / "ck", state, None, dc.SAFETENSORS)
    loads: list[int] = []
    real = torch.load

    def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counted)
    into = _state(1)
    into["model"].update({f"layer{i}": torch.zeros(4, 4) for i in range(20)})
    got = _load(info, into)
    for i in range(20):
        assert torch.equal(got["model"][f"layer{i}"], state["model"][f"layer{i}"])
    _assert_same(got, state)
    values = [k for k in _index_keys(info) if not k.startswith("model.")]
    assert len(loads) < len(values)  # the values that are not tensors; no tensor's


def test_a_tensor_the_index_names_but_the_blob_lacks_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = _save(tmp_path / "ck", _state(7), None, dc.SAFETENSORS)
    import safetensors.torch

    real = safetensors.torch.load
    monkeypatch.setattr(
        safetensors.torch,
        "load",
        lambda data: {k: v for k, v in real(data).items() if k != "model.w"},
    )
    with pytest.raises(CheckpointMismatch, match=r"'model\.w'.*no such tensor"):
        _load(info, _state(1))


def test_an_unknown_tensor_format_is_refused_naming_the_ones_read(tmp_path: Path) -> None:
    info = _save(tmp_path / "ck", _state(7), None, dc.SAFETENSORS)
    info.manifest[dc.TENSOR_FORMAT] = "gguf"
    with pytest.raises(CheckpointMismatch, match=r"'gguf'.*'torch_save' and 'safetensors'"):
        _load(info, _state(1))


def test_tied_weights_save_in_safetensors_and_load_back_into_both_names(tmp_path: Path) -> None:
    """safetensors refuses two names for one storage; the quick GPT ties its embedding and
    head, and the trainer's planner writes the second name as a copy."""
    state = _state(7)
    shared = torch.randn(5, 3)
    state["model"]["emb"], state["model"]["head"] = shared, shared
    info = _save(tmp_path / "ck", state, dc._OneStoragePerNameSavePlanner(), dc.SAFETENSORS)
    into = _state(1)
    tied = torch.zeros(5, 3)
    into["model"]["emb"], into["model"]["head"] = tied, tied
    got = _load(info, into)
    assert torch.equal(got["model"]["emb"], shared) and got["model"]["head"] is tied
    _assert_same(got, state)


def test_what_read_whole_reads_fills_a_rank_s_state_as_the_load_does_int_keys_kept(
    tmp_path: Path,
) -> None:
    """A launcher reads the checkpoint once (read_whole) and each rank fills its own state
    from it (fill_from): the same values as load_group's in-place load, and AdamW's
    per-parameter ids stay ints (DCP's index holds them as text: "optimizer.state.0")."""
    info = _save(tmp_path / "ck", _state(7), None, dc.SAFETENSORS)
    read = dc.read_whole(info)
    assert list(read["optimizer"]["state"]) == ["0"]  # as the index names it
    into = _state(1)
    weights = into["model"]["w"]
    dc.fill_from(info, into, read)
    _assert_same(into, _state(7))
    assert list(into["optimizer"]["state"]) == [0]
    assert into["model"]["w"] is weights  # copied into the rank's own tensor


def test_filling_a_state_the_checkpoint_lacks_or_shapes_otherwise_is_refused(
    tmp_path: Path,
) -> None:
    info = _save(tmp_path / "ck", _state(7), None, dc.SAFETENSORS)
    read = dc.read_whole(info)
    more = _state(1)
    more["model"]["extra"] = torch.zeros(2)
    with pytest.raises(CheckpointMismatch, match=r"holds no 'model\.extra'"):
        dc.fill_from(info, more, read)
    other = _state(1)
    other["model"]["w"] = torch.zeros(2, 3)
    with pytest.raises(CheckpointMismatch, match=r"'model\.w' is not a torch.float32 tensor"):
        dc.fill_from(info, other, read)


def test_without_the_safetensors_package_shards_are_torch_save_and_safetensors_ones_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors comes with the lab's extra, not the base install (the drill alone needs
    none of it): a base install writes torch_save shards, and says what to install to read
    a checkpoint the lab wrote."""
    info = _save(tmp_path / "ck", _state(7), None, dc.SAFETENSORS)
    real = dc.importlib.util.find_spec
    monkeypatch.setattr(
        dc.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "safetensors" else real(name, *a),
    )
    assert dc.shard_writer(tmp_path / "other")[1] == dc.TORCH_SAVE
    with pytest.raises(CheckpointMismatch, match="pip install safetensors"):
        _load(info, _state(1))
