"""Multi-rank checkpoints through torch.distributed.checkpoint, under the one atomic
contract of every checkpoint (checkpoint_layout.py).

    ckpt/step-00000040/
        __0_0.distcp     rank 0's shard: the replicated state (weights, AdamW state,
                         counters; DCP writes one copy) and rank 0's own RNG + data cursor
        __1_0.distcp     rank 1's shard: its own RNG states and data cursor
                         (data_layout = "global": a global sample position, as rank 0's)
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
teaching mode rank_state = "rank0" saves only rank 0's and has every rank ask for it).

Another number of ranks (`check_world`, before DCP reads anything): a checkpoint whose
ranks drew private data streams (data_layout = "per_rank") is refused, naming both world
sizes, since its cursors cannot map. One of data_layout = "global" (its cursor is a global
sample position, trainer/global_batches.py) reshards: every new rank asks DCP for the
replicated keys and rank 0's cursor, and DCP reads them into any world size (its own
resharding: one copy of a replicated value serves every rank); no old rank's RNG is
read, each new rank derives its own (global_batches.resharded_rng_seed). The resume is
not bit-identical, and cannot be: the same samples are summed over another split. The
teaching layout ckpt_layout = "rank_files" (trainer/rank_files_checkpoint.py) writes
through `save_group` too, its `write` one torch.save per rank, and refuses any other
world size. DCP stores non-tensor values with torch.save; they are read back here
with weights_only=True. Its `.metadata` index is a pickle, read only after the manifest's
sha256 of it matched (the trainer's own write, or a mirror copy the manifest vouches for),
and once per process (cached by that sha256: held_ranks and dcp.load share it).

What a restart costs is mostly DCP's reading: one torch.load per item, 143 per rank for
the quick preset, 117 of them tensors (model 29, AdamW 84). Each value that is not a tensor
stays an item of its own, under its own name, because `crashdrill inspect` reads those names
from the index (train_state.step, optimizer.param_groups…): packing them into one item per
key saved 23 loads (about 7 ms of CPU per rank) and left inspect saying "optimizer state:
missing". A checkpoint written that way (`<key>._values` in its index: by commits 858e7fd
to da3c461, half an hour of 2026-12-06) is refused, naming a fresh run dir.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config  # torch.load imports it on first use: after the fork
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

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
# The item under each top-level key that held all its non-tensor values, in checkpoints
# written by commits 858e7fd to da3c461 (2026-12-06); refused since (load_group).
PACKED_VALUES = "._values"
DCP_INDEX = ".metadata"  # DCP's index of every shard (a pickle), named by FileSystemWriter


class WorldSizeMismatch(CheckpointMismatch):
    """A checkpoint written by another number of ranks than this run has (`written`)."""

    def __init__(self, text: str, written: int | None = None) -> None:
        super().__init__(text)
        self.written = written


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
        owner = layout.shard_rank(name)
        out[str(owner if owner is not None else 0)].append(name)
    return out


def save_group(
    root: Path,
    keep: int,
    group: RankGroup,
    step: int,
    state: dict[str, Any],
    meta: dict,
    write: Callable[[Path], None] | None = None,
) -> GroupSave:
    """Write the checkpoint of `step` from every rank (a collective: call it on all). The
    leader of a lab's trainer says the write's begin and end (trainer/checkpoint_pause.py):
    from before any rank writes until after the last barrier. `write(work)`: how this rank
    writes its files into the temp dir (default: its DCP shard); the manifest's `layout`
    comes from `meta` (default DCP_LAYOUT)."""
    say = group.leader and announces(os.environ)
    if say:
        print(writing_line(step), file=sys.stderr, flush=True)
    if write is None:
        write = lambda work: dcp.save(  # noqa: E731
            state,
            storage_writer=dcp.FileSystemWriter(str(work), sync_files=True),
            # One copy of what every rank holds, and it is rank 0's: DCP's default
            # balances the copies by tensor size, and non-tensor values then land on
            # whichever rank (rank 1's best_val is None: only rank 0 evaluates).
            planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),
        )
    try:
        return _save_group(root, keep, group, step, write, meta)
    finally:
        if say:
            print(written_line(step), file=sys.stderr, flush=True)


def _save_group(
    root: Path, keep: int, group: RankGroup, step: int, write: Callable[[Path], None], meta: dict
) -> GroupSave:
    t0 = time.perf_counter()
    work, final = root / layout.temp_dir_name(step), root / layout.step_dir_name(step)
    if group.leader:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    dist.barrier()
    write(work)
    dist.barrier()  # every rank's files are in (dcp.save is a collective; a plain write not)
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


def check_world(info: layout.CheckpointInfo, world: int, data_layout: str = "per_rank") -> bool:
    """Refuse a checkpoint that is not a DCP one this run can load, saying which it is.
    True when it was written by another world size and loads resharded: a run of
    data_layout = "global" from a checkpoint of the same layout (the cursor is a global
    sample position; the weights and AdamW state are replicated, and DCP reads them into
    any world size). Per-rank streams (data_layout = "per_rank") cannot map: refused."""
    m = info.manifest
    if m.get("layout") != DCP_LAYOUT:
        raise WorldSizeMismatch(
            f"{info.path.name} was written by a one-rank run, this run has {world} ranks; "
            "resharding a one-rank checkpoint is not supported: use ranks = 1 or a fresh "
            "--run-dir",
            written=1,
        )
    saved = m.get("world_size")
    if saved == world:
        return False
    if m.get("data_layout") == "global" and data_layout == "global":
        return True
    raise WorldSizeMismatch(
        f"{info.path.name} was written by {saved} ranks, this run has {world}; each of its "
        'ranks drew a private data stream (data_layout = "per_rank"), whose cursor means '
        f"nothing on another world size, so no rank's state is dropped or guessed: use "
        f'ranks = {saved}, or start with data_layout = "global" (a global sample position '
        "that reshards)",
        written=saved if isinstance(saved, int) else None,
    )


def held_ranks(info: layout.CheckpointInfo) -> set[int]:
    """The ranks whose own state (RNG, data cursor) the verified checkpoint `info` holds,
    read from DCP's index (its keys "rank<r>.…"); a checkpoint of rank files holds every
    rank that wrote it."""
    if info.manifest.get("layout") != DCP_LAYOUT:
        return set(range(int(info.manifest.get("world_size", 0))))
    held: set[int] = set()
    for key in _index(str(info.path), _index_sha256(info)).state_dict_metadata:
        head = key.split(".", 1)[0]
        if head.startswith("rank") and head[4:].isdigit():
            held.add(int(head[4:]))
    return held


def load_group(info: layout.CheckpointInfo, group: RankGroup, state: dict[str, Any]) -> None:
    """Load the verified checkpoint `info` into `state` in place (a collective); `state`
    asks for the keys to read (on another world size: the replicated ones and rank 0's
    global cursor, check_world having allowed it)."""
    reader = _VerifiedIndexReader(info)
    if any(k.endswith(PACKED_VALUES) for k in reader.read_metadata().state_dict_metadata):
        raise CheckpointMismatch(
            f"{info.path} keeps its values that are not tensors packed in one item per key "
            "(a layout written for half an hour on 2026-12-06, since dropped); this trainer "
            "cannot resume it: start again with a fresh --run-dir"
        )
    dcp.load(state, storage_reader=reader, planner=_WeightsOnlyLoadPlanner())


def _index_sha256(info: layout.CheckpointInfo) -> str:
    """The manifest's sha256 of DCP's index: what the verification of `info` matched."""
    return str(info.manifest["files"][DCP_INDEX]["sha256"])


@lru_cache(maxsize=4)
def _index(path: str, sha256: str) -> Metadata:
    """DCP's index of the checkpoint at `path`, unpickled once per process; keyed by the
    sha256 its verification matched, so a rewritten checkpoint is read again."""
    return dcp.FileSystemReader(path).read_metadata()


class _VerifiedIndexReader(dcp.FileSystemReader):
    """DCP's file reader, given the index this process already read (after the manifest's
    sha256 of it matched): a restart unpickles it once, not again inside dcp.load."""

    def __init__(self, info: layout.CheckpointInfo) -> None:
        super().__init__(str(info.path))
        self._sha256 = _index_sha256(info)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # a per-rank index: DCP's fallback, not ours
            return super().read_metadata(*args, **kwargs)
        meta = _index(str(self.path), self._sha256)
        storage = getattr(meta, "storage_meta", None)  # an index pickled by an older torch
        if storage is None:
            storage = meta.storage_meta = StorageMeta()
        storage.load_id = self.load_id  # as FileSystemReader.read_metadata does
        return meta
