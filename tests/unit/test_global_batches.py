"""The global data layout (trainer/global_batches.py) and what a checkpoint on another world
size is told (trainer/dcp_checkpoint.check_world, trainer/rank_files_checkpoint.refusal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from crashdrill.trainer.checkpoint_layout import CheckpointInfo
from crashdrill.trainer.config import ConfigError, TrainConfig
from crashdrill.trainer.dcp_checkpoint import WorldSizeMismatch, check_world
from crashdrill.trainer.global_batches import (
    GlobalBatchSampler,
    global_slice,
    resharded_rng_seed,
)
from crashdrill.trainer.rank_batches import RankBatchSampler, RankCursorMismatch
from crashdrill.trainer.rank_files_checkpoint import load_rank_file, refusal
from crashdrill.trainer.ranks import RankGroup

CFG = TrainConfig(batch=8, ctx=8, seed=7, ranks=2, data_layout="global")
DATA = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint16)


def _group_batch(step: int, world: int) -> torch.Tensor:
    """Every rank's slice of update `step`, in rank order: what the group trains on."""
    return torch.cat([global_slice(DATA, CFG, step, r, world)[0] for r in range(world)])


def test_the_global_batch_of_a_step_is_the_same_windows_split_among_any_world_size() -> None:
    for step in (0, 5):
        one = _group_batch(step, 1)
        assert one.shape == (8, 8)
        assert torch.equal(_group_batch(step, 2), one) and torch.equal(_group_batch(step, 4), one)
    assert not torch.equal(_group_batch(0, 1), _group_batch(1, 1))


def test_a_global_cursor_of_2_ranks_resumes_on_4_at_the_same_global_sample() -> None:
    two = [GlobalBatchSampler(DATA, CFG, r, 2) for r in range(2)]
    for _ in range(3):
        for s in two:
            s.next_batch()
    saved = two[1].state_dict()
    assert saved == two[0].state_dict()  # a global position: the same on every rank
    assert saved["samples_consumed"] == 3 * CFG.batch
    four = [GlobalBatchSampler(DATA, CFG, r, 4) for r in range(4)]
    for s in four:
        s.load_state_dict(saved)
    resumed = torch.cat([s.next_batch()[0] for s in four])
    assert resumed.shape == (8, 8) and torch.equal(resumed, _group_batch(3, 1))


def test_each_layout_refuses_the_other_s_cursor_naming_both() -> None:
    per_rank = RankBatchSampler(DATA, CFG, 0, 2)
    glob = GlobalBatchSampler(DATA, CFG, 0, 2)
    with pytest.raises(RankCursorMismatch, match='saved with data_layout = "per_rank"'):
        glob.load_state_dict(per_rank.state_dict())
    with pytest.raises(RankCursorMismatch, match='saved with data_layout = "global"'):
        per_rank.load_state_dict(glob.state_dict())


def test_a_world_size_that_does_not_divide_the_global_batch_is_refused_naming_those_that_do() -> (
    None
):
    with pytest.raises(ConfigError) as err:
        CFG.with_overrides({"ranks": 3})
    assert err.value.field == "ranks"
    assert "divides batch = 8" in str(err.value) and "one of 1, 2, 4, 8" in str(err.value)
    assert TrainConfig(batch=6, ranks=3).ranks == 3  # per-rank streams: any world size
    with pytest.raises(ConfigError, match="data_layout = 'columns' is not allowed"):
        TrainConfig(data_layout="columns")


def test_a_resharded_rank_s_rng_seed_depends_on_its_rank_world_and_step() -> None:
    seeds = {resharded_rng_seed(7, r, w, s) for r, w, s in [(0, 1, 50), (0, 2, 50), (1, 2, 50),
                                                          (0, 1, 100)]}  # fmt: skip
    assert len(seeds) == 4 and resharded_rng_seed(7, 0, 1, 50) == resharded_rng_seed(7, 0, 1, 50)
    assert all(0 <= s < 2**63 for s in seeds)


def _info(tmp_path: Path, **manifest: Any) -> CheckpointInfo:
    return CheckpointInfo(50, tmp_path / "step-00000050", dict(manifest))


def test_a_dcp_checkpoint_reshards_only_from_and_into_the_global_layout(tmp_path: Path) -> None:
    glob = _info(tmp_path, layout="dcp", world_size=2, data_layout="global")
    assert check_world(glob, 2, "global") is False  # the same world: no resharding
    assert check_world(glob, 1, "global") is True and check_world(glob, 4, "global") is True
    per_rank = _info(tmp_path, layout="dcp", world_size=2)  # written before data_layout
    with pytest.raises(WorldSizeMismatch) as err:
        check_world(per_rank, 1, "global")
    assert "written by 2 ranks, this run has 1" in str(err.value)
    assert "use ranks = 2" in str(err.value)
    with pytest.raises(WorldSizeMismatch, match='data_layout = "per_rank"'):
        check_world(glob, 1, "per_rank")


def test_rank_files_of_2_ranks_are_refused_by_1_rank_naming_rank_1_s_state(tmp_path: Path) -> None:
    info = _info(tmp_path, layout="rank_files", world_size=2)
    assert refusal(info, 2) is None
    why = refusal(info, 1)
    assert why is not None and "written by 2 ranks, this run has 1" in why
    assert "rank 1's RNG states and data position would be silently dropped" in why
    assert "restart with ranks = 2" in why
    four = refusal(info, 4)
    assert four is not None and "ranks 2 to 3 would have no file of their own" in four
    with pytest.raises(WorldSizeMismatch, match="written by 2 ranks, this run has 1"):
        load_rank_file(info, RankGroup(0, 1))  # refused before any file is read


def test_a_lesson_whose_restart_world_size_its_runs_refuse_is_refused_when_read() -> None:
    from crashdrill.trainer.presets import PresetError, dump_preset, get_preset, parse_preset_text

    text = dump_preset(get_preset("lesson-1.18"))
    assert get_preset("lesson-1.18").crash.restart_ranks == 1
    bad = text.replace("restart_ranks = 1", "restart_ranks = 3")
    with pytest.raises(PresetError) as err:
        parse_preset_text(bad)
    assert "[crash] restart_ranks = 3: run A refuses it" in str(err.value)
    assert "one of 1, 2, 4, 8" in str(err.value)


def test_a_crash_test_s_restart_takes_the_lesson_s_settings_on_for_good() -> None:
    from crashdrill.workers.launch import Launch

    launch = Launch(Path("/tmp/run"), "lesson-1.18", "A", command=("crashdrill", "run"),
                    crash_settings=("ranks=1",))  # fmt: skip
    assert "--set" not in launch.argv(require_checkpoint=False)
    after = launch.after_crash()
    assert after.argv(require_checkpoint=True)[-3:] == ["--set", "ranks=1", "--require-checkpoint"]
    assert after.after_crash() == after  # a second crash test restarts it the same way
