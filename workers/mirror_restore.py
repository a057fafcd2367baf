"""Reading the checkpoint mirror back: the layout of the copies, and the pull that a
restart without a checkpoint on the machine uses.

    restore_latest("gs://my-bucket/crashdrill", run_dir)   # -> Restored(step=…) or None

Layout: `<mirror>/<run dir name>/step-XXXXXXXX/` holds the checkpoint's files and its
`MANIFEST.json` (uploaded last; a copy without one does not exist): workers/mirror_layout.py.
A pull reads the
manifest as JSON (nothing from a mirror is ever unpickled), downloads every file it
lists into `ckpt/step-XXXXXXXX.tmp/`, checks each size and sha256, renames the directory
into place and writes the manifest last — the trainer's own atomic order — so the
trainer then verifies it once more and loads it with `torch.load(weights_only=True)`.
A copy that fails is reported and the next older one is tried.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashdrill.trainer.checkpoint_layout import (
    MANIFEST,
    CorruptCheckpoint,
    check_listed,
    ckpt_root,
    step_dir_name,
    temp_dir_name,
)
from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.file_primitives import fsync_dir, sha256_of
from crashdrill.workers.mirror_backends import Backend, MirrorError, MirrorURLError, open_backend
from crashdrill.workers.mirror_layout import copy_base, mirror_key, mirrored_files


class CorruptCopy(Exception):
    """A mirrored checkpoint that fails verification; never used."""


@dataclass(frozen=True)
class Restored:
    step: int
    url: str  # the copy it came from
    path: Path  # where it now is in the run dir
    bytes: int
    seconds: float


def restore_latest(
    mirror_url: str,
    run_dir: str | Path,
    *,
    on_rejected: Callable[[str], None] | None = None,
    backend: Backend | None = None,
) -> Restored | None:
    """Pull the run's newest mirrored checkpoint that verifies into `run_dir/ckpt/`.

    Each copy's files are checked against its manifest (size and sha256) before the
    manifest is written last into the run dir; a copy that fails is reported through
    `on_rejected(text)` and the next older one is tried. None when the mirror has no
    usable copy. Raises MirrorError when the mirror cannot be read at all."""
    run_dir = Path(run_dir)
    backend = backend or open_backend(mirror_url)
    by_step = mirrored_files(backend, mirror_key(run_dir))
    for step in sorted((s for s, n in by_step.items() if MANIFEST in n), reverse=True):
        try:
            return _pull(backend, run_dir, step)
        except CorruptCopy as e:
            if on_rejected is not None:
                on_rejected(str(e))
        except MirrorError as e:
            if e.transient:
                raise  # the mirror is unreachable: no older copy will do better
            if on_rejected is not None:  # e.g. pruned while we read it
                on_rejected(f"the copy of step {step} could not be read: {e}")
    return None


def _pull(backend: Backend, run_dir: Path, step: int) -> Restored:
    t0 = time.perf_counter()
    name = step_dir_name(step)
    base = copy_base(mirror_key(run_dir), step)
    url = backend.url_of(base)
    raw = backend.read(f"{base}/{MANIFEST}")
    try:
        files = check_listed(json.loads(raw), step)
    except (ValueError, CorruptCheckpoint) as e:  # JSON only: nothing from the mirror is unpickled
        raise CorruptCopy(f"the copy of step {step} at {url} is unusable: {e}") from None
    root = ckpt_root(run_dir)
    tmp = root / temp_dir_name(step)  # never loaded by the trainer, removed by its next start
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for fname, entry in files.items():
            with open(tmp / fname, "w+b") as f:
                backend.get(f"{base}/{fname}", f)
                f.flush()
                os.fsync(f.fileno())
                size = os.fstat(f.fileno()).st_size
                if size != entry["bytes"] or sha256_of(f) != entry["sha256"]:
                    raise CorruptCopy(
                        f"the copy of step {step} at {url} fails verification: {fname} is"
                        f" {size} bytes and does not match its sha256 in the manifest"
                    )
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        (final / (MANIFEST + ".tmp")).write_bytes(raw)
        with open(final / (MANIFEST + ".tmp"), "rb") as f:
            os.fsync(f.fileno())
        os.replace(final / (MANIFEST + ".tmp"), final / MANIFEST)
        fsync_dir(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(int(e["bytes"]) for e in files.values()) + len(raw)
    return Restored(step, url, final, total, time.perf_counter() - t0)


@dataclass(frozen=True)
class MirrorPull:
    """What a restart found in the mirror: the pulled checkpoint (or None) and the
    warnings to log before the restart's own event."""

    restored: Restored | None
    events: list[dict[str, Any]]


def pull_for_restart(mirror_url: str, run_dir: Path, segment: int) -> MirrorPull:
    """For a supervisor whose run dir has no checkpoint: `restore_latest`, with every
    rejected copy and an unreachable mirror turned into warning events."""
    events: list[dict[str, Any]] = []

    def warn(text: str, code: str) -> None:
        events.append(build_event(code, text, segment=segment))

    def rejected(text: str) -> None:
        warn(f"Rejected a mirrored checkpoint: {text}; trying an older one.", "mirror_rejected")

    try:
        restored = restore_latest(mirror_url, run_dir, on_rejected=rejected)
    except (MirrorError, MirrorURLError, OSError) as e:
        warn(
            f"No checkpoint on this machine, and the mirror {mirror_url} failed: {e}.",
            "mirror_unreachable",
        )
        restored = None
    return MirrorPull(restored, events)
