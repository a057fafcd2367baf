"""The teaching checkpoint layout `ckpt_layout = "rank_files"`: every rank torch.saves its
whole state into a file named by its rank, as many scripts do, under the same atomic
contract as every checkpoint (written to a temp dir, the manifest last, then renamed).

    ckpt/step-00000050/
        rank-0.pt        rank 0's weights, AdamW state, counters, its RNG and data cursor
        rank-1.pt        rank 1's: the same weights and AdamW state again, its own RNG and cursor
        MANIFEST.json    sha256 of both, which rank wrote which, the world size; last

    save_rank_files(root, keep, group, step, state, meta)   # every rank calls it
    state = load_rank_file(info, group)                     # this rank's own file

At the world size that wrote it, it resumes exactly like a DCP checkpoint: rank r reads
rank-r.pt. On another world size there is no rank-r.pt for each new rank, or a file that
no rank would read: a run of 1 resuming 2 ranks' files would silently drop rank 1's RNG
and data position (Megatron-Bridge#5637 is that bug). It is refused instead, loudly and
before anything is read: "written by 2 ranks, this run has 1", with what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer.dcp_checkpoint import GroupSave, WorldSizeMismatch, save_group
from crashdrill.trainer.ranks import RankGroup

RANK_FILES_LAYOUT = "rank_files"  # the manifest's `layout`, as ckpt_layout names it


def save_rank_files(
    root: Path, keep: int, group: RankGroup, step: int, state: dict[str, Any], meta: dict
) -> GroupSave:
    """Write the checkpoint of `step`: this rank's file (a collective: call it on all)."""

    def write(work: Path) -> None:
        torch.save(state, work / layout.rank_file_name(group.rank))

    return save_group(root, keep, group, step, state, {**meta, "layout": RANK_FILES_LAYOUT}, write)


def refusal(info: layout.CheckpointInfo, world: int) -> str | None:
    """Why a checkpoint of rank files cannot be resumed by `world` ranks; None when it can."""
    saved = info.manifest.get("world_size")
    if saved == world:
        return None
    if isinstance(saved, int) and saved > world:
        lost = ", ".join(str(r) for r in range(world, saved))
        what = f"rank {lost}'s RNG states and data position would be silently dropped"
        if saved - world > 1:
            what = f"the RNG states and data positions of ranks {lost} would be silently dropped"
    else:
        what = f"ranks {saved} to {world - 1} would have no file of their own to resume"
    return (
        f"{info.path.name} was written by {saved} ranks, this run has {world}: it holds one "
        f"file per rank (rank-0.pt … rank-{int(saved or 1) - 1}.pt), each rank's whole state, "
        f"and {what}. Refusing to resume it: restart with ranks = {saved}, or save through "
        'torch.distributed.checkpoint (ckpt_layout = "dcp") with data_layout = "global", '
        "which reshards onto another world size"
    )


def load_rank_file(info: layout.CheckpointInfo, group: RankGroup) -> dict[str, Any]:
    """This rank's state from the verified checkpoint `info`, without unpickling code;
    WorldSizeMismatch (saying which ranks' state would be lost) on another world size."""
    why = refusal(info, group.world)
    if why is not None:
        saved = info.manifest.get("world_size")
        raise WorldSizeMismatch(why, written=saved if isinstance(saved, int) else None)
    path = info.path / layout.rank_file_name(group.rank)
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state
