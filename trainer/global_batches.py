"""The global data layout (`data_layout = "global"`): one stream for the whole group, each
rank training on its contiguous slice, and a cursor that maps onto any world size.

    sampler = GlobalBatchSampler(data.train, cfg, rank=1, world=2)  # rank 1's half of each step
    x, y = global_slice(data.train, cfg, step=7, rank=1, world=2)    # its batch of step 7, anew
    sampler.state_dict()["samples_consumed"]                          # global samples: step × batch

The global batch of update s (0-based) is `cfg.batch` windows drawn by a generator seeded
from (seed, s) alone: a pure function of seed and step, whatever the world size. Rank r of
a world of w trains on windows [r·b/w, (r+1)·b/w) of it, b/w each (the config refuses a w
that does not divide b, naming the sizes that do). The cursor is the global sample
position, the samples the whole group has consumed (step × batch): the same on every
rank, and meaningful on any world size. A resume on another world size sets the same
position, so the group trains on exactly the same global samples from there, split anew.

What does not map is each rank's RNG (dropout; a rank of a world of 1 is not rank 0 of a
world of 2): a resharded rank starts its global RNG streams from `resharded_rng_seed`, a
pure function of (seed, rank, new world, step), so the resume is itself reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crashdrill.trainer.config import TrainConfig, allowed_worlds
from crashdrill.trainer.data import _window_batch
from crashdrill.trainer.rank_batches import RankCursorMismatch

GLOBAL = "global"  # the cursor's `layout`, as data_layout names it
# Odd 64-bit constants: steps (and resharded ranks) get seeds far apart in the seed space.
_STEP_SPREAD = 0xD1B54A32D192ED03
_RESHARD_SPREAD = 0xAEF17502108EF2D9


def step_seed(seed: int, step: int) -> int:
    """The seed of the global batch of update `step` (0-based)."""
    return (seed * 2 + 1 + (step + 1) * _STEP_SPREAD) % 2**64


def global_indices(n_windows: int, cfg: TrainConfig, step: int) -> torch.Tensor:
    """The start of every window of the global batch of update `step`: (batch,)."""
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step))
    return torch.randint(n_windows, (cfg.batch,), generator=g)


def resharded_rng_seed(seed: int, rank: int, world: int, step: int) -> int:
    """Where rank `rank` of a world of `world` starts its RNG streams when it resumed, at
    `step`, a checkpoint written by another world size (whose ranks' RNG cannot map)."""
    pair = world * 64 + rank + 1  # unique per (rank, world) for world ≤ 64
    return (step_seed(seed, step) + pair * _RESHARD_SPREAD) % 2**63


class GlobalBatchSampler:
    """Rank `rank`'s slice of the global stream; the interface of data.BatchSampler."""

    def __init__(self, data: np.ndarray, cfg: TrainConfig, rank: int, world: int) -> None:
        if cfg.batch % world:
            raise ValueError(f"batch = {cfg.batch} does not split among {world} ranks: "
                             f"one of {allowed_worlds(cfg.batch)}")  # fmt: skip
        self.data, self.cfg, self.rank, self.world = data, cfg, rank, world
        self.per_rank = cfg.batch // world
        self.samples_consumed = 0  # by the whole group: step × batch

    @property
    def windows_per_step(self) -> int:
        """Windows the whole group trains on in one update: the global batch."""
        return self.cfg.batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.samples_consumed // self.cfg.batch
        ix = global_indices(len(self.data) - self.cfg.ctx - 1, self.cfg, step)
        lo = self.rank * self.per_rank
        self.samples_consumed += self.cfg.batch
        return _window_batch(self.data, ix[lo : lo + self.per_rank], self.cfg.ctx)

    def state_dict(self) -> dict[str, Any]:
        return {"layout": GLOBAL, "samples_consumed": self.samples_consumed,
                "batch": self.cfg.batch, "seed": self.cfg.seed}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("layout") != GLOBAL:
            raise RankCursorMismatch(
                'the data cursor was saved with data_layout = "per_rank" (one private stream '
                'per rank); this run has data_layout = "global": use the layout that wrote it'
            )
        if state.get("batch") != self.cfg.batch:
            raise RankCursorMismatch(
                f"the data cursor was saved with a global batch of {state.get('batch')}; this"
                f" run's is {self.cfg.batch}: the global sample position would not map"
            )
        self.samples_consumed = int(state["samples_consumed"])


def global_slice(
    data: np.ndarray, cfg: TrainConfig, step: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch that rank `rank` of a world of `world` trains on in update `step`."""
    sampler = GlobalBatchSampler(data, cfg, rank, world)
    sampler.samples_consumed = step * cfg.batch
    return sampler.next_batch()
