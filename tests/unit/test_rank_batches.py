from __future__ import annotations

import numpy as np
import pytest
import torch

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler
from crashdrill.trainer.rank_batches import (
    RankBatchSampler,
    RankCursorMismatch,
    pair_index,
    rank_batch,
)

CFG = TrainConfig(batch=4, ctx=8, seed=7)
DATA = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint16)  # no repeats


def _draws(sampler: BatchSampler, n: int) -> list[torch.Tensor]:
    return [sampler.next_batch()[0] for _ in range(n)]


def test_one_rank_draws_exactly_the_batches_the_one_process_sampler_always_drew() -> None:
    old, new = BatchSampler(DATA, CFG), RankBatchSampler(DATA, CFG, rank=0, world=1)
    for a, b in zip(_draws(old, 6), _draws(new, 6), strict=True):
        assert torch.equal(a, b)


def test_a_rank_s_batch_is_a_pure_function_of_seed_step_rank_and_world() -> None:
    stream = _draws(RankBatchSampler(DATA, CFG, rank=1, world=2), 5)
    for step in (0, 3, 4):
        assert torch.equal(rank_batch(DATA, CFG, step, rank=1, world=2)[0], stream[step])
    other_seed = TrainConfig(batch=4, ctx=8, seed=8)
    assert not torch.equal(rank_batch(DATA, other_seed, 3, rank=1, world=2)[0], stream[3])


def test_every_rank_of_every_world_draws_batches_of_its_own() -> None:
    pairs = [(r, w) for w in (1, 2, 4) for r in range(w)]
    assert len({pair_index(r, w) for r, w in pairs}) == len(pairs)
    firsts = [rank_batch(DATA, CFG, 0, r, w)[0] for r, w in pairs]
    for i, a in enumerate(firsts):
        for b in firsts[i + 1 :]:
            assert not torch.equal(a, b)


def test_a_rank_continues_its_stream_from_its_saved_cursor() -> None:
    sampler = RankBatchSampler(DATA, CFG, rank=1, world=2)
    _draws(sampler, 3)
    resumed = RankBatchSampler(DATA, CFG, rank=1, world=2)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.samples_consumed == 3 * CFG.batch
    assert torch.equal(resumed.next_batch()[0], rank_batch(DATA, CFG, 3, rank=1, world=2)[0])


def test_a_rank_refuses_the_cursor_another_rank_saved() -> None:
    rank0 = RankBatchSampler(DATA, CFG, rank=0, world=2)
    with pytest.raises(RankCursorMismatch, match="saved by rank 0 of 2; this is rank 1 of 2"):
        RankBatchSampler(DATA, CFG, rank=1, world=2).load_state_dict(rank0.state_dict())
