"""Where a run's checkpoints live and which of them count: the one home of the layout that
the trainer writes and the supervisor, the mirror, the mirror's restore and the drill read.
Nothing here imports torch.

    find_latest(run_dir)                       # newest checkpoint that verifies, or None
    find_latest(run_dir, check="manifest")     # the same rule without reading the weights
    step_dir_name(1300)                        # "step-00001300"
    parse_step_dir("step-00001300")            # 1300; None for a name the trainer never writes

The rule, as checkpoint.py writes it:

    DIR/ckpt/step-00001300/        a checkpoint: its files, then MANIFEST.json, written last
    DIR/ckpt/step-00001300.tmp/    a write in progress (renamed into place when complete)
    DIR/ckpt/latest/               the single slot of ckpt_write = "inplace", overwritten in
                                   place; its step is the one its manifest names

- A checkpoint directory is named `step_dir_name(N)`: "step-" and N in ASCII digits,
  zero-padded to 8 (more digits once N reaches 10^8). That exact name and no other:
  `step-7`, `step-000000000007` or `step-12abc` are not checkpoints, so no two directories
  can claim one step and every reader agrees on which directory holds step N.
- A directory without a valid manifest does not exist for any reader. Valid is checked at
  one of three depths, each including the one before:
    "manifest"  MANIFEST.json is a JSON object naming the directory's step (the slot: any
                step). Readers that must stay cheap (the supervisor's messages, its restart
                decision, pruning) stop here.
    "listed"    ... and it lists the checkpoint's files, each a plain file name with its
                size and sha256: what a copy needs (the mirror uploads and pulls these).
    "verified"  ... and it is this crashdrill's format and every file has its size and
                sha256 (the trainer, before it loads one; the default).
  Only a manifest that is missing, torn or foreign makes the depths disagree, and then a
  deeper reader skips a checkpoint that a cheaper one named; what the trainer writes
  passes all three.
- Newest first is by step; a corrupt newer checkpoint falls back to the next older one.
- The mirror copies step directories only, never the in-place slot (it is overwritten in
  place, so no copy of it could be consistent): it reads with `slot=False`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from crashdrill.trainer.file_primitives import sha256_of

CKPT_DIR = "ckpt"
MANIFEST = "MANIFEST.json"
INPLACE_SLOT = "latest"
TEMP_SUFFIX = ".tmp"
FORMAT_VERSION = 1
# The file (`<stem>.pt`) every checkpoint has, weights-only ones too: step, tokens, config,
# fingerprints, format version, and the parts (below) that it holds under their keys.
TRAIN_STATE_FILE = "train_state"


@dataclass(frozen=True)
class Part:
    """One part of the training state in a checkpoint (its manifest's `parts` name it):
    the word the trainer's events and the resume check use, what it holds where the word
    does not say it, and where its state dict lies: file `<file>.pt`, under `key`
    (None: the whole file)."""

    word: str
    file: str
    key: str | None = None
    holds: str = ""


# What a checkpoint holds, in report order: the one table of parts. The trainer binds each
# name to the object whose state_dict it is (trainer/train_state.py); readers without torch
# (the server) take the words from here.
PARTS: dict[str, Part] = {
    "weights": Part("weights", file="model"),
    "optimizer": Part("AdamW state", file="optimizer", holds="moments and step counts"),
    "schedule": Part("schedule position", file=TRAIN_STATE_FILE, key="schedule"),
    "rng": Part("RNG states", file=TRAIN_STATE_FILE, key="rng"),
    "data": Part("data position", file=TRAIN_STATE_FILE, key="data"),
}
PARTS_FULL = tuple(PARTS)
PARTS_WEIGHTS = ("weights",)  # ckpt_state = "weights", a teaching mode
PART_WORDS = {name: part.word for name, part in PARTS.items()}


# The parts each rank of a multi-rank run holds for itself (trainer/dcp_checkpoint.py):
# named "rank<r>.<part>" where a checkpoint lacks one rank's ("rank1.rng").
RANK_OWN_PARTS = ("rng", "data")
_RANK_PART = re.compile(r"rank([0-9]+)\.([a-z_]+)")


def rank_part(rank: int, part: str) -> str:
    """The name of rank `rank`'s own `part` ("rank1.rng"), as `missing` lists it."""
    return f"rank{rank}.{part}"


def part_description(part: str) -> str:
    """A part's word and, where the word does not say it, what it holds: "AdamW state
    (moments and step counts)"; one rank's own part is "rank 1's RNG states". An unknown
    part is its own name."""
    m = _RANK_PART.fullmatch(part)
    if m and m.group(2) in PARTS:
        return f"rank {int(m.group(1))}'s {part_description(m.group(2))}"
    known = PARTS.get(part)
    if known is None:
        return part
    return f"{known.word} ({known.holds})" if known.holds else known.word


Check = Literal["manifest", "listed", "verified"]
_STEP_NAME = re.compile(r"step-([0-9]{8,})")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
# The files torch.distributed.checkpoint writes in a multi-rank checkpoint (its
# FileSystemWriter's names): each rank's shard `__<rank>_<n>.distcp`, and `.metadata`, the
# coordinator's index of every shard. Plain names too, listed in the manifest like any file.
DCP_METADATA = ".metadata"
_DCP_SHARD = re.compile(r"__([0-9]{1,4})_[0-9]{1,6}\.distcp")


def dcp_shard_rank(name: str) -> int | None:
    """The rank that wrote DCP shard file `name`; None for any other name."""
    m = _DCP_SHARD.fullmatch(name)
    return int(m.group(1)) if m else None


# The teaching layout ckpt_layout = "rank_files" (trainer/rank_files_checkpoint.py): each
# rank's whole state in one file named by its rank, as many scripts write it.
_RANK_FILE = re.compile(r"rank-([0-9]{1,4})\.pt")


def rank_file_name(rank: int) -> str:
    """Rank `rank`'s file in a checkpoint of layout rank_files: "rank-1.pt"."""
    return f"rank-{rank}.pt"


def shard_rank(name: str) -> int | None:
    """The rank that wrote file `name` of a multi-rank checkpoint (a DCP shard or a rank
    file); None for a file of the group (DCP's index)."""
    m = _RANK_FILE.fullmatch(name)
    return int(m.group(1)) if m else dcp_shard_rank(name)


def plain_file_name(name: str) -> bool:
    """A name a manifest may list: no separators, no `.` or `..`, not the manifest."""
    if name == MANIFEST:
        return False
    return (
        bool(_FILE_NAME.fullmatch(name)) or name == DCP_METADATA or dcp_shard_rank(name) is not None
    )


_SHA256 = re.compile(r"[0-9a-f]{64}")


class CorruptCheckpoint(Exception):
    """A checkpoint whose manifest is missing, unreadable, or does not match its files."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    manifest: dict[str, Any]
    manifest_bytes: bytes = b""  # the manifest exactly as read (a copy sends these bytes)

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        """{file name: {"sha256", "bytes"}} as the manifest lists them."""
        files = self.manifest.get("files")
        return files if isinstance(files, dict) else {}

    @property
    def created(self) -> float | None:
        created = self.manifest.get("created")
        return created if isinstance(created, int | float) else None

    @property
    def identity(self) -> tuple[int, float | None]:
        """A step written again after a resume is a different checkpoint."""
        return (self.step, self.created)


# ---------------------------------------------------------------- names


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def temp_dir_name(step: int) -> str:
    """Where the checkpoint of `step` is written before its rename: never loaded."""
    return step_dir_name(step) + TEMP_SUFFIX


def parse_step_dir(name: str) -> int | None:
    """The step of a checkpoint directory name; None unless it is `step_dir_name(step)`."""
    m = _STEP_NAME.fullmatch(name)
    if m is None:
        return None
    step = int(m.group(1))
    return step if step_dir_name(step) == name else None


def manifest_owner(rel: str) -> str | None:
    """For a path relative to ckpt/ (as a file listing names it): the checkpoint directory
    whose manifest it is, a step directory or the in-place slot; None for any other file."""
    head, _, tail = rel.partition("/")
    if tail != MANIFEST:
        return None
    return head if head == INPLACE_SLOT or parse_step_dir(head) is not None else None


# ---------------------------------------------------------------- manifests


def check_listed(manifest: Any, step: int) -> dict[str, dict[str, Any]]:
    """The `files` of the manifest of `step`, each a plain file name with its size and
    sha256. Raises CorruptCheckpoint saying what is wrong ("its manifest ...")."""
    if not isinstance(manifest, dict) or manifest.get("step") != step:
        raise CorruptCheckpoint(f"its manifest is not the manifest of step {step}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpoint("its manifest lists no files")
    for name, entry in files.items():
        if not plain_file_name(name):
            raise CorruptCheckpoint(
                f"its manifest names a file {name!r}, which is not a plain name"
            )
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int):
            raise CorruptCheckpoint(f"its manifest has no size for {name}")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise CorruptCheckpoint(f"its manifest has no sha256 for {name}")
    return files


def read_checkpoint(path: Path, check: Check = "verified") -> CheckpointInfo:
    """Checkpoint directory `path` (a step directory or the slot), checked to depth
    `check`. Raises CorruptCheckpoint naming the directory and what is wrong."""
    try:
        raw = (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: no {MANIFEST} (the write never finished)") from None
    except OSError as e:
        raise CorruptCheckpoint(f"{path.name}: {MANIFEST} is unreadable ({e})") from None
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpoint(f"{path.name}: {MANIFEST} is unreadable ({e})") from None
    step = parse_step_dir(path.name)
    if step is None and isinstance(manifest, dict):  # the slot: the step its manifest names
        step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CorruptCheckpoint(f"{path.name}: its manifest names no step")
    if not isinstance(manifest, dict) or manifest.get("step") != step:
        raise CorruptCheckpoint(f"{path.name}: its manifest is not the manifest of step {step}")
    info = CheckpointInfo(step, path, manifest, raw)
    if check == "manifest":
        return info
    if check == "verified" and manifest.get("format") != FORMAT_VERSION:
        raise CorruptCheckpoint(
            f"{path.name}: format {manifest.get('format')!r}, "
            f"this crashdrill reads {FORMAT_VERSION}"
        )
    try:
        files = check_listed(manifest, step)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(f"{path.name}: {e}") from None
    if check == "verified":
        for name, entry in files.items():
            _verify_file(path, name, entry)
    return info


def _verify_file(path: Path, name: str, entry: dict[str, Any]) -> None:
    fpath = path / name
    if not fpath.is_file():
        raise CorruptCheckpoint(f"{path.name}: {name} is missing")
    size = fpath.stat().st_size
    if size != entry["bytes"]:
        raise CorruptCheckpoint(
            f"{path.name}: {name} is {size} bytes, the manifest says {entry['bytes']} (torn write)"
        )
    with open(fpath, "rb") as f:
        digest = sha256_of(f)
    if digest != entry["sha256"]:
        raise CorruptCheckpoint(f"{path.name}: {name} fails its sha256 check (corrupted)")


# ---------------------------------------------------------------- finding them


def candidates(run_dir: str | Path, *, slot: bool = True) -> list[tuple[int, Path]]:
    """Checkpoint directories by name, newest first, not yet checked; the slot at the
    step its manifest names (-1 when that is unreadable)."""
    try:
        entries = list(ckpt_root(run_dir).iterdir())
    except OSError:
        return []
    found: list[tuple[int, bool, Path]] = []
    for p in entries:
        step = parse_step_dir(p.name)
        if step is not None and p.is_dir():
            found.append((step, True, p))
        elif slot and p.name == INPLACE_SLOT and p.is_dir():
            try:
                named = json.loads((p / MANIFEST).read_bytes()).get("step", -1)
            except (OSError, ValueError, UnicodeDecodeError, AttributeError):
                named = -1
            found.append((named if isinstance(named, int) else -1, False, p))
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)  # a step dir before the slot on a tie
    return [(step, p) for step, _, p in found]


def checkpoints(
    run_dir: str | Path,
    *,
    check: Check = "verified",
    slot: bool = True,
    on_corrupt: Callable[[str], None] | None = None,
) -> Iterator[CheckpointInfo]:
    """Every checkpoint that passes `check`, newest first, read lazily. Each one that does
    not is reported through `on_corrupt` and skipped."""
    for _step, path in candidates(run_dir, slot=slot):
        try:
            info = read_checkpoint(path, check)
        except CorruptCheckpoint as e:
            if on_corrupt is not None:
                on_corrupt(str(e))
            continue
        yield info


def find_latest(
    run_dir: str | Path,
    on_corrupt: Callable[[str], None] | None = None,
    *,
    check: Check = "verified",
    slot: bool = True,
) -> CheckpointInfo | None:
    """The newest checkpoint that passes `check`. Each corrupt newer one is reported
    through `on_corrupt` (the trainer's loud fallback), then skipped."""
    return next(checkpoints(run_dir, check=check, slot=slot, on_corrupt=on_corrupt), None)
