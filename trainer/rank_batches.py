"""Each rank's batches: a pure function of (seed, step, rank, world size).

    sampler = RankBatchSampler(data.train, cfg, rank=1, world=2)   # what rank 1 trains on
    x, y = rank_batch(data.train, cfg, step=7, rank=1, world=2)     # its batch of step 7, anew

Every (rank, world) pair has its own private stream, seeded by `rank_stream_seed`: the
one-rank stream keeps the seed BatchSampler always had (`seed * 2 + 1`), so a run with
ranks = 1 draws exactly the batches it drew before ranks existed, and every other pair
gets a seed of its own (two ranks never train on the same windows by construction of the
seed, and a 2-rank run's rank 0 is not a 4-rank run's rank 0). The batch of step s is the
s-th draw of that stream: `rank_batch` replays it from nothing, the sampler continues it
from its saved state. Each rank saves its own cursor (generator state, samples consumed,
and the rank and world size it belongs to) and refuses another rank's on load: a rank
that resumed from rank 0's cursor would silently train on rank 0's batches. Such a cursor
cannot move to another world size; the layout that can is trainer/global_batches.py
(`data_layout = "global"`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler

# Odd 64-bit constant (the golden ratio's): consecutive (rank, world) pairs get seeds far
# apart in the generator's seed space.
_SPREAD = 0x9E3779B97F4A7C15


class RankCursorMismatch(ValueError):
    """A data cursor saved by another rank or world size."""


def pair_index(rank: int, world: int) -> int:
    """A unique index per (rank, world) pair, 0 only for the one-rank run: world w's ranks
    take w*(w-1)/2 … w*(w-1)/2 + w - 1."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return world * (world - 1) // 2 + rank


def rank_stream_seed(seed: int, rank: int, world: int) -> int:
    """The seed of (rank, world)'s private batch stream; `seed * 2 + 1` for one rank."""
    return (seed * 2 + 1 + pair_index(rank, world) * _SPREAD) % 2**64


class RankBatchSampler(BatchSampler):
    """BatchSampler on the stream of one rank of a world."""

    def __init__(self, data: np.ndarray, cfg: TrainConfig, rank: int, world: int) -> None:
        super().__init__(data, cfg)
        self.rank, self.world = rank, world
        self.generator = torch.Generator().manual_seed(rank_stream_seed(cfg.seed, rank, world))

    @property
    def windows_per_step(self) -> int:
        """Windows the whole group trains on in one update: every rank's batch."""
        return self.batch * self.world

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rank": self.rank, "world": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "layout" in state:  # only a global cursor says its layout (global_batches.py)
            raise RankCursorMismatch(
                f'the data cursor was saved with data_layout = "{state["layout"]}"; this run has'
                ' data_layout = "per_rank": use the layout that wrote it'
            )
        saved = (state.get("rank"), state.get("world"))
        if saved != (self.rank, self.world):
            raise RankCursorMismatch(
                f"the data cursor was saved by rank {saved[0]} of {saved[1]}; this is rank "
                f"{self.rank} of {self.world}: refusing to train on another rank's batches"
            )
        super().load_state_dict(state)


def rank_batch(
    data: np.ndarray, cfg: TrainConfig, step: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch that (rank, world) trains on in update `step` (0-based), from nothing."""
    sampler = RankBatchSampler(data, cfg, rank, world)
    for _ in range(step):
        sampler.next_batch()
    return sampler.next_batch()
