"""The checkpoint a restarted group resumes from, read once by its launcher before it forks
the ranks, which inherit it (trainer/ranks.py forks them; trainer/rank_loop.py uses it).

    ahead = read_ahead(cfg, run_dir)       # in the launcher: ReadAhead, or None
    # each rank, after the fork: its own model's and optimizer's state filled from it
    fill_from(ahead.info, state, ahead.state)          (trainer/dcp_checkpoint.py)

Without it every rank of a restarted group found, verified and read the same shards at
the same moment (on 2 cores, two ranks parsing the replicated weights and AdamW state each,
beside their launcher and the supervisor): the largest part of a 2-rank restart that a
one-rank restart does not have. The launcher reads it alone, on one thread (no OpenMP pool
in a process about to fork), and each rank copies what it inherited into its own tensors.

Only the plain case is read ahead: the newest checkpoint verifies, was written through DCP
by this world size, holds every rank's own RNG states and data position, and the run
restores each rank's own (rank_state = "own"). Anything else — a corrupt newest one, another
world size (a reshard, or a refusal), one rank file per rank, the teaching mode that
restores rank 0's for all — is left to the ranks, which find it, say so and decide exactly
as they did before: nothing read here is said or decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.dcp_checkpoint import DCP_LAYOUT, held_ranks, read_whole
from crashdrill.trainer.train_state import CheckpointMismatch


@dataclass(frozen=True)
class ReadAhead:
    info: layout.CheckpointInfo  # the verified checkpoint
    state: dict[str, Any]  # every key of it, as read_whole reads it


def read_ahead(cfg: TrainConfig, run_dir: Path) -> ReadAhead | None:
    """The newest checkpoint of `run_dir`, verified and read whole, when it is one every
    rank of this run resumes as it is; None: the ranks find and read it themselves."""
    if cfg.rank_state != "own" or cfg.ckpt_layout != DCP_LAYOUT:
        return None
    found = layout.candidates(run_dir)
    if not found:
        return None
    try:
        info = layout.read_checkpoint(found[0][1], "verified")
    except layout.CorruptCheckpoint:
        return None  # the ranks reject it loudly and fall back, as without a read ahead
    manifest = info.manifest
    if manifest.get("layout") != DCP_LAYOUT or manifest.get("world_size") != cfg.ranks:
        return None
    if not set(range(cfg.ranks)) <= held_ranks(info):
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # copies of large tensors stay off OpenMP: no pool to fork
    try:
        state = read_whole(info)
    except CheckpointMismatch:
        return None  # the ranks refuse it, saying why
    finally:
        torch.set_num_threads(threads)
    return ReadAhead(info, state)
