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


def _save(where: Path, state: dict[str, Any], planner: Any) -> CheckpointInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no process group: one process
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(where)), planner=planner)
    files = {}
    for p in where.iterdir():
        with open(p, "rb") as f:
            files[p.name] = {"sha256": sha256_of(f), "bytes": p.stat().st_size}
    manifest = {"layout": dc.DCP_LAYOUT, "world_size": 2, "files": files}
    return CheckpointInfo(step=0, path=where, manifest=manifest)


def _load(info: CheckpointInfo, into: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dc.load_group(info, None, into)  # type: ignore[arg-type]  # no group: one process
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


def test_every_value_is_an_item_under_its_own_name_and_loads_back(tmp_path: Path) -> None:
    info = _save(tmp_path / "ck", _state(7), None)
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
