"""Multi-rank checkpoints through torch.distributed.checkpoint, under the one atomic
contract of every checkpoint (checkpoint_layout.py).

    ckpt/step-00000040/
        __0_0.distcp     rank 0's shard: the replicated state (weights, AdamW state,
                         counters; DCP writes one copy) and rank 0's own RNG + data cursor
        __1_0.distcp     rank 1's shard: its own RNG states and data cursor
        .metadata        DCP's index of every shard (the coordinator's)
        MANIFEST.json    sha256 and size of every file above, which rank wrote which, the
                         world size; written last

    saved = save_group(writer_args, group, step, state, meta)    # every rank calls it
    load_group(info, group, state)                               # every rank calls it

The write: rank 0 makes `step-N.tmp/`; every rank writes its shard (dcp.save, a
collective: it returns when every shard and the index are written); rank 0 fsyncs each
file, hashes it, writes the manifest into the temp dir, renames it to `step-N/`, fsyncs
the root and prunes to `keep`; a barrier, and the step is saved for every rank. A kill at
any point before the rename leaves a `.tmp` dir, which never counts.

The state of each rank is a dict under fixed keys: "model", "optimizer", "train_state"
(the same on every rank) and "rank<r>" (this rank's own "rng" and "data"). Loading asks
only for this rank's key, so a rank can only get its own RNG and cursor back (the
teaching mode rank_state = "rank0" saves only rank 0's and has every rank ask for it); a
checkpoint written by another number of ranks is refused before DCP reads it (resharding
is not done yet). DCP stores non-tensor values with torch.save; they are read back here
with weights_only=True. Its `.metadata` index is a pickle, read only after the manifest's
sha256 of it matched (the trainer's own write, or a mirror copy the manifest vouches for).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer.checkpoint_pause import (
    announces,
    paused_line,
    pauses_from_env,
    writing_line,
    written_line,
)
from crashdrill.trainer.file_primitives import fsync_dir, sha256_of
from crashdrill.trainer.ranks import RankGroup
from crashdrill.trainer.train_state import CheckpointMismatch

# The manifest's words for a DCP checkpoint: its `layout`, and who wrote what.
DCP_LAYOUT = "dcp"


class WorldSizeMismatch(CheckpointMismatch):
    """A checkpoint written by another number of ranks than this run has."""


def rank_key(rank: int) -> str:
    """The key of rank `rank`'s own state (RNG, data cursor) in a DCP checkpoint."""
    return f"rank{rank}"


@dataclass(frozen=True)
class GroupSave:
    step: int
    path: Path
    bytes: int
    seconds: float


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but non-tensor values are loaded without unpickling code."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _hash_files(work: Path) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for path in sorted(work.iterdir()):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            entries[path.name] = {"sha256": sha256_of(f), "bytes": path.stat().st_size}
    return entries


def _rank_files(entries: dict[str, Any], world: int) -> dict[str, list[str]]:
    """Which rank wrote which file; the index is rank 0's (the coordinator's)."""
    out: dict[str, list[str]] = {str(r): [] for r in range(world)}
    for name in entries:
        owner = layout.dcp_shard_rank(name)
        out[str(owner if owner is not None else 0)].append(name)
    return out


def save_group(
    root: Path, keep: int, group: RankGroup, step: int, state: dict[str, Any], meta: dict
) -> GroupSave:
    """Write the checkpoint of `step` from every rank (a collective: call it on all). The
    leader of a lab's trainer says the write's begin and end (trainer/checkpoint_pause.py):
    from before any rank writes until after the last barrier."""
    say = group.leader and announces(os.environ)
    if say:
        print(writing_line(step), file=sys.stderr, flush=True)
    try:
        return _save_group(root, keep, group, step, state, meta)
    finally:
        if say:
            print(written_line(step), file=sys.stderr, flush=True)


def _save_group(
    root: Path, keep: int, group: RankGroup, step: int, state: dict[str, Any], meta: dict
) -> GroupSave:
    t0 = time.perf_counter()
    work, final = root / layout.temp_dir_name(step), root / layout.step_dir_name(step)
    if group.leader:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    dist.barrier()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(work), sync_files=True))
    total = 0
    if group.leader:
        # The test/drill hook that holds a write open (trainer/checkpoint_pause.py): every
        # shard is written, the manifest not yet; the other ranks wait at the barrier below.
        pause = pauses_from_env(os.environ).get(step, 0.0)
        if pause:
            print(paused_line(step), file=sys.stderr)
            sys.stderr.flush()
            time.sleep(pause)
        entries = _hash_files(work)
        total = sum(e["bytes"] for e in entries.values())
        manifest = {
            "format": layout.FORMAT_VERSION,
            "step": step,
            "files": entries,
            "created": time.time(),
            "layout": DCP_LAYOUT,
            "world_size": group.world,
            "rank_files": _rank_files(entries, group.world),
            **meta,
        }
        tmp = work / (layout.MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, work / layout.MANIFEST)
        fsync_dir(work)
        if final.exists():  # re-saving a step after a resume: replace it whole
            shutil.rmtree(final)
        os.replace(work, final)
        fsync_dir(root)
        done = [c.path for c in layout.checkpoints(root.parent, check="manifest", slot=False)]
        for old in done[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()  # the step counts as saved on every rank only once it is in place
    return GroupSave(step, final, total, time.perf_counter() - t0)


def check_world(info: layout.CheckpointInfo, world: int) -> None:
    """Refuse a checkpoint that is not a DCP one of `world` ranks, saying which it is."""
    m = info.manifest
    if m.get("layout") != DCP_LAYOUT:
        raise WorldSizeMismatch(
            f"{info.path.name} was written by a one-rank run, this run has {world} ranks; "
            "resharding is not supported yet: use ranks = 1 or a fresh --run-dir"
        )
    if m.get("world_size") != world:
        raise WorldSizeMismatch(
            f"{info.path.name} was written by {m.get('world_size')} ranks, this run has "
            f"{world}; resharding is not supported yet, so no rank's state is dropped: use "
            f"ranks = {m.get('world_size')} or a fresh --run-dir"
        )


def held_ranks(info: layout.CheckpointInfo) -> set[int]:
    """The ranks whose own state (RNG, data cursor) the verified checkpoint `info` holds,
    read from DCP's index (its keys "rank<r>.…")."""
    meta = dcp.FileSystemReader(str(info.path)).read_metadata()
    held: set[int] = set()
    for key in meta.state_dict_metadata:
        head = key.split(".", 1)[0]
        if head.startswith("rank") and head[4:].isdigit():
            held.add(int(head[4:]))
    return held


def load_group(info: layout.CheckpointInfo, group: RankGroup, state: dict[str, Any]) -> None:
    """Load the verified checkpoint `info` into `state` in place (a collective)."""
    check_world(info, group.world)
    dcp.load(
        state,
        storage_reader=dcp.FileSystemReader(str(info.path)),
        planner=_WeightsOnlyLoadPlanner(),
    )
