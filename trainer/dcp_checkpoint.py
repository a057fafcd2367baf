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
any point before the rename leaves a `.tmp` dir, which never counts. A group spread over
nodes (RankGroup.spread: each node a disk of its own) does the same on every node: each
node's leader makes the temp dir there, the nodes exchange the files their ranks wrote
(`_share_files`), rank 0 hashes the whole set and broadcasts the manifest, and each node
commits it on its own disk, so every node holds each whole checkpoint.

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

What a restart costs was mostly DCP's reading: with FileSystemWriter's default format every
tensor is its own torch.save item and FileSystemReader torch.loads each one back (117 of the
quick preset's 143 items per rank: model 29, AdamW 84; about 0.4 ms apiece in the weights-only
unpickler). Shards are now written in DCP's own safetensors format (FileSystemWriter's
`serialization_format=SAFETENSORS`: a shard's values that are not tensors first, each its own
torch.save item as before, then all its tensors in one safetensors blob), and read by
`_VerifiedIndexReader`: one read of each shard file, one safetensors parse of its blob, the
values through the weights-only planner. The manifest's `tensor_format` says which format a
checkpoint's tensors are in; one without it (written before) is read by DCP's reader as
before. Each value that is not a tensor stays an item of its own, under its own name,
because `crashdrill inspect` reads those names from the index (train_state.step,
optimizer.param_groups…): packing them into one item per key saved 23 loads (about 7 ms of
CPU per rank) and left inspect saying "optimizer state: missing". A checkpoint written that
way (`<key>._values` in its index: by commits 858e7fd to da3c461, half an hour of
2026-12-06) is refused, naming a fresh run dir.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.utils.serialization.config  # torch.load imports it on first use: after the fork
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

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
# The manifest's key for the format of a checkpoint's tensors (DCP's SerializationFormat
# values); a manifest without it was written in TORCH_SAVE, FileSystemWriter's default.
TENSOR_FORMAT = "tensor_format"
SAFETENSORS = "safetensors"
TORCH_SAVE = "torch_save"


def shard_writer(work: Path) -> tuple[dcp.FileSystemWriter, str]:
    """DCP's file writer for the shards in `work`, and the manifest's `tensor_format` of
    what it writes: DCP's SAFETENSORS format where this torch has it (2.8+) and the
    safetensors package is installed (DCP's writer imports it), else its default."""
    fmt = getattr(dcp_filesystem, "SerializationFormat", None)
    if fmt is None or importlib.util.find_spec("safetensors") is None:
        return dcp.FileSystemWriter(str(work), sync_files=True), TORCH_SAVE
    writer = dcp.FileSystemWriter(str(work), sync_files=True, serialization_format=fmt.SAFETENSORS)
    return writer, SAFETENSORS


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


class _OneStoragePerNameSavePlanner(DefaultSavePlanner):
    """DCP's save planner, but a tensor whose storage an earlier item of this save already
    wrote is written as a copy: safetensors refuses two names for one storage, and a model
    with tied weights (the quick GPT's embedding and head) has them. Loading puts the same
    values into both names, which share their storage again in the model."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # one planner per save
        super().__init__(*args, **kwargs)
        self._storages: set[int] = set()

    def resolve_data(self, write_item: Any) -> Any:
        data = super().resolve_data(write_item)
        if isinstance(data, torch.Tensor):
            storage = data.untyped_storage().data_ptr()
            if storage in self._storages:
                return data.clone()
            self._storages.add(storage)
        return data


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
        writer, tensors = shard_writer(root / layout.temp_dir_name(step))  # _save_group's work
        meta = {**meta, TENSOR_FORMAT: tensors}
        write = lambda work: dcp.save(  # noqa: E731
            state,
            storage_writer=writer,
            # One copy of what every rank holds, and it is rank 0's: DCP's default
            # balances the copies by tensor size, and non-tensor values then land on
            # whichever rank (rank 1's best_val is None: only rank 0 evaluates).
            planner=_OneStoragePerNameSavePlanner(dedup_save_to_lowest_rank=True),
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
    if group.node_leader:  # each node's disk gets its temp dir (one machine: rank 0's)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    dist.barrier()
    write(work)
    dist.barrier()  # every rank's files are in (dcp.save is a collective; a plain write not)
    if group.spread:
        _share_files(work, group)
    total = 0
    manifest: dict[str, Any] | None = None
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
    if group.spread:  # rank 0's manifest, committed on every node's disk
        sent = [manifest]
        dist.broadcast_object_list(sent, src=0)
        manifest = sent[0]
        assert manifest is not None
        total = sum(e["bytes"] for e in manifest["files"].values())
    if group.node_leader:
        assert manifest is not None
        _commit(root, work, final, manifest, keep)
    dist.barrier()  # the step counts as saved on every rank only once it is in place
    return GroupSave(step, final, total, time.perf_counter() - t0)


def _commit(root: Path, work: Path, final: Path, manifest: dict[str, Any], keep: int) -> None:
    """The manifest written last into the temp dir, the rename, the prune to `keep`."""
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


def _share_files(work: Path, group: RankGroup) -> None:
    """A group spread over nodes: every node's disk gets every file of the checkpoint.
    DCP writes each rank's shard on its own node and the index on rank 0's, and reads a
    replicated tensor from the one shard that holds it; a node that has only its own
    shard could not load alone. Each node's leader sends what its ranks wrote (over the
    group's process group, the lab's models being megabytes) and writes what the other
    nodes wrote, so a restart on the same nodes resumes from local disk and any node's
    copy is complete for the mirror. What a lost node took with it is on the others."""
    mine: dict[str, bytes] = {}
    if group.node_leader:
        mine = {p.name: p.read_bytes() for p in sorted(work.iterdir())}
    every: list[Any] = [None] * group.world
    dist.all_gather_object(every, mine)
    if not group.node_leader:
        return
    for files in every:
        for name, data in (files or {}).items():
            if not (work / name).exists():
                with open(work / name, "wb") as f:
                    f.write(data)


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


def load_group(info: layout.CheckpointInfo, group: RankGroup | None, state: dict[str, Any]) -> None:
    """Load the verified checkpoint `info` into `state` in place, in this process alone (no
    collective: every rank calls it after all agreed on `info`, or a launcher before it
    forks them, read_whole); `state` asks for the keys to read (on another world size: the
    replicated ones and rank 0's global cursor, check_world having allowed it)."""
    reader = _VerifiedIndexReader(info)
    if any(k.endswith(PACKED_VALUES) for k in reader.read_metadata().state_dict_metadata):
        raise CheckpointMismatch(
            f"{info.path} keeps its values that are not tensors packed in one item per key "
            "(a layout written for half an hour on 2026-12-06, since dropped); this trainer "
            "cannot resume it: start again with a fresh --run-dir"
        )
    try:
        # no_dist: each rank plans and reads its own keys without DCP's collectives (a
        # gather and a scatter of the plans, and a gather of the results, over gloo); every
        # rank already agreed on this checkpoint (rank_loop._find), and reads the same
        # verified files. DCP warns that it "assumes the intent" of one process: it is ours.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is ", UserWarning)
            dcp.load(state, storage_reader=reader, planner=_WeightsOnlyLoadPlanner(), no_dist=True)
    except CheckpointException as e:  # DCP wraps what its reader raised, per rank
        for failure in e.failures.values():  # (exception, its traceback) per rank
            first = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(first, CheckpointMismatch):
                raise CheckpointMismatch(str(first)) from e
        raise


def read_whole(info: layout.CheckpointInfo) -> dict[str, Any]:
    """Every key of the verified DCP checkpoint `info`, read in this one process into new
    tensors (their shapes and dtypes from DCP's index, nested as they were saved) and its
    values weights-only: what a launcher reads once for the ranks it forks next, instead of
    each rank reading it (trainer/rank_loop.py)."""
    index = _index(str(info.path), _index_sha256(info))
    paths = index.planner_data or {}
    state: dict[str, Any] = {}
    for key, item in index.state_dict_metadata.items():
        value = (
            torch.empty(item.size, dtype=item.properties.dtype)
            if isinstance(item, TensorStorageMetadata)
            else None  # a value that is not a tensor: DCP replaces it
        )
        if key in paths:
            set_element(state, paths[key], value)
        else:
            state[key] = value
    load_group(info, None, state)
    return state


def fill_from(info: layout.CheckpointInfo, state: dict[str, Any], read: dict[str, Any]) -> None:
    """Put into `state` what read_whole read of `info`, as load_group would have loaded it:
    every name `state` asks for, by DCP's flattened names (so `state`'s own key types stay:
    AdamW's per-parameter ids are ints, DCP's index holds them as text), a tensor copied
    into `state`'s own, a value put in its place. A name `read` lacks, or a tensor of
    another shape or dtype, is refused as DCP's own load refuses it."""
    wanted, paths = flatten_state_dict(state)
    have, _ = flatten_state_dict(read)
    for name, target in wanted.items():
        if name not in have:
            raise CheckpointMismatch(f"{info.path} holds no {name!r}; this run's state has it")
        value = have[name]
        if isinstance(target, torch.Tensor):
            if not isinstance(value, torch.Tensor) or (value.shape, value.dtype) != (
                target.shape,
                target.dtype,
            ):
                raise CheckpointMismatch(
                    f"{info.path}: {name!r} is not a {target.dtype} tensor of shape "
                    f"{tuple(target.shape)}, as this run's is"
                )
            target.detach().copy_(value)
        else:
            set_element(state, paths[name], value)


def model_weights(info: layout.CheckpointInfo) -> dict[str, torch.Tensor]:
    """The weights of the verified DCP checkpoint `info`, read in this one process (no
    group): only the `model` key's tensors, in either tensor format (the drill's
    comparison of final weights)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is ", UserWarning)
        state = _load_state_dict_from_keys(
            keys={"model"}, storage_reader=_VerifiedIndexReader(info)
        )
    return dict(state["model"])


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
    sha256 of it matched): a restart unpickles it once, not again inside dcp.load. Shards
    written in DCP's safetensors format (the manifest's `tensor_format`) are read by
    `_read_safetensors_shards`; others by FileSystemReader itself."""

    def __init__(self, info: layout.CheckpointInfo) -> None:
        super().__init__(str(info.path))
        self._sha256 = _index_sha256(info)
        self._format = info.manifest.get(TENSOR_FORMAT, TORCH_SAVE)
        if self._format not in (TORCH_SAVE, SAFETENSORS):
            raise CheckpointMismatch(
                f"{info.path} keeps its tensors in {self._format!r}; this trainer reads "
                f"{TORCH_SAVE!r} and {SAFETENSORS!r}"
            )
        if self._format == SAFETENSORS and importlib.util.find_spec("safetensors") is None:
            raise CheckpointMismatch(
                f"{info.path} keeps its tensors in safetensors, and the safetensors package "
                "is not installed: pip install safetensors"
            )

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self._format != SAFETENSORS:
            return super().read_data(plan, planner)
        _read_safetensors_shards(self, plan, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # a per-rank index: DCP's fallback, not ours
            return super().read_metadata(*args, **kwargs)
        meta = _index(str(self.path), self._sha256)
        storage = getattr(meta, "storage_meta", None)  # an index pickled by an older torch
        if storage is None:
            storage = meta.storage_meta = StorageMeta()
        storage.load_id = self.load_id  # as FileSystemReader.read_metadata does
        return meta


def _read_safetensors_shards(
    reader: dcp.FileSystemReader, plan: LoadPlan, planner: LoadPlanner
) -> None:
    """Read `plan`'s items from shards FileSystemWriter wrote in its SAFETENSORS format:
    each file read once; a value that is not a tensor from its own byte range (a torch.save
    the planner loads weights-only); the tensors from the one safetensors blob that follows
    them, parsed once per file (every tensor item's recorded offset is the blob's start)."""
    from safetensors.torch import load as load_safetensors

    per_file: dict[str, list[ReadItem]] = {}
    for item in plan.items:
        per_file.setdefault(reader.storage_data[item.storage_index].relative_path, []).append(item)
    for name, items in per_file.items():
        with open(Path(reader.path) / name, "rb") as f:
            data = f.read()
        tensors: dict[str, torch.Tensor] | None = None
        for item in items:
            where = reader.storage_data[item.storage_index]
            if item.type == LoadItemType.BYTE_IO:
                value = data[where.offset : where.offset + where.length]
                planner.load_bytes(item, io.BytesIO(value))
                continue
            if tensors is None:
                try:
                    tensors = load_safetensors(data[where.offset :])
                except Exception as e:  # safetensors raises its own SafetensorError
                    raise CheckpointMismatch(
                        f"{Path(reader.path) / name}: its tensors are not a readable "
                        f"safetensors blob at byte {where.offset}: {e}"
                    ) from e
            fqn = item.storage_index.fqn
            if fqn not in tensors:
                raise CheckpointMismatch(
                    f"{Path(reader.path) / name}: DCP's index names tensor {fqn!r} in this "
                    "shard, and its safetensors blob has no such tensor"
                )
            tensor = narrow_tensor_by_index(tensors[fqn], item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != tensor.size():
                raise CheckpointMismatch(
                    f"{Path(reader.path) / name}: tensor {fqn!r} is {tuple(tensor.size())} "
                    f"in the shard, {tuple(target.size())} in this run"
                )
            target.copy_(tensor)
            planner.commit_tensor(item, target)
