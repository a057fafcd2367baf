"""The checkpoint format: a directory per step, written atomically, manifest last.

    ckpt/step-00001300/
        model.pt         weights
        optimizer.pt     AdamW state (moments, step counts) and param groups
        train_state.pt   step, tokens, schedule position, data cursor, every RNG stream,
                         the eval window's step losses, config, fingerprints, format
                         version
        MANIFEST.json    sha256 and size of every file above; written last

A directory without a valid manifest does not exist for the loader. Which directories
count, and how a manifest is verified, is the layout's rule (checkpoint_layout.py), shared
with every other reader. Everything is loaded with torch.load(weights_only=True): RNG
states are stored as tensors and ints, so loading a checkpoint never unpickles code.

Teaching modes (never the default) switch parts of this off, through the same writer:
  ckpt_state = "weights"   only the weights (and the step) — what many scripts save
  ckpt_write = "inplace"   one slot, `ckpt/latest/`, overwritten file by file: a crash
                           during the write leaves a torn checkpoint
  ckpt_mode  = "async"     snapshot to memory, persist in a background thread (this one
                           is a real optimisation, kept bit-identical)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crashdrill.trainer import checkpoint_layout
from crashdrill.trainer.checkpoint_layout import (
    FORMAT_VERSION,
    INPLACE_SLOT,
    MANIFEST,
    TEMP_SUFFIX,
    CheckpointInfo,
    checkpoints,
    ckpt_root,
    find_latest,
    rank_file_name,
    step_dir_name,
    temp_dir_name,
)
from crashdrill.trainer.checkpoint_pause import (
    announces,
    paused_line,
    pauses_from_env,
    writing_line,
    written_line,
)
from crashdrill.trainer.file_primitives import fsync_dir

# What a checkpoint holds and the words for it: the layout's (no torch), named here too
# for the writer's users.
PARTS_FULL = checkpoint_layout.PARTS_FULL
PARTS_WEIGHTS = checkpoint_layout.PARTS_WEIGHTS
PART_WORDS = checkpoint_layout.PART_WORDS


@dataclass(frozen=True)
class SaveResult:
    step: int
    path: Path
    bytes: int
    seconds: float  # how long training was blocked
    persist_seconds: float  # how long the bytes took to reach the disk
    parts: tuple[str, ...]


def _snapshot(obj: Any) -> Any:
    """A deep copy of a state tree with every tensor cloned to CPU: what async mode
    persists while training moves on."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


class CheckpointWriter:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        keep: int = 2,
        write: str = "atomic",
        mode: str = "sync",
        on_error: Callable[[str], object] | None = None,
        on_saved: Callable[[SaveResult], None] | None = None,
    ) -> None:
        self.root = ckpt_root(run_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.write = write
        self.mode = mode
        self.on_error = on_error or (lambda msg: print(msg, file=sys.stderr))
        self.on_saved = on_saved  # called once a checkpoint is complete on disk
        # The test/drill hook that holds a write open (trainer/checkpoint_pause.py): read
        # once, so that a malformed value stops the run before it trains (PauseError).
        self.pauses = pauses_from_env(os.environ)
        # The lab's trainers say each write's begin and end, so that a hold (a student
        # answering, workers/hold.py) never stops one inside a write.
        self.announce = announces(os.environ)
        self._thread: threading.Thread | None = None
        self._last: SaveResult | None = None
        self._remove_stale_temp_dirs()

    def _remove_stale_temp_dirs(self) -> None:
        # A .tmp directory is a write that a crash interrupted; it never counts.
        for p in self.root.glob("*" + TEMP_SUFFIX):
            shutil.rmtree(p, ignore_errors=True)

    def save(self, step: int, files: dict[str, dict[str, Any]], meta: dict[str, Any]) -> SaveResult:
        """Persist `files` (file stem → state tree) as the checkpoint for `step`.

        sync: returns when the checkpoint is complete on disk.
        async: returns after a memory snapshot; a background thread persists it. At most one
        write is in flight: a second save waits for the first (bounded memory)."""
        t0 = time.perf_counter()
        self.wait()
        if self.mode == "async":
            snap = _snapshot(files)
            blocked = time.perf_counter() - t0
            self._thread = threading.Thread(
                target=self._persist_logged, args=(step, snap, meta, blocked), daemon=True
            )
            self._thread.start()
            path = self.root / (INPLACE_SLOT if self.write == "inplace" else step_dir_name(step))
            return SaveResult(step, path, _estimate_bytes(snap), blocked, 0.0, tuple(meta["parts"]))
        return self._persist(step, files, meta, 0.0, t0)

    def wait(self) -> SaveResult | None:
        """Block until an in-flight async write is complete; returns its result."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._last

    def _persist_logged(
        self, step: int, files: dict[str, Any], meta: dict[str, Any], blocked: float
    ) -> None:
        try:
            self._persist(step, files, meta, blocked, time.perf_counter())
        except Exception as e:  # a failed background write must be seen, not swallowed
            self.on_error(f"checkpoint at step {step} failed to write: {e}")

    def _persist(
        self, step: int, files: dict[str, Any], meta: dict[str, Any], blocked: float, t0: float
    ) -> SaveResult:
        if not self.announce:
            return self._write(step, files, meta, blocked, t0)
        _say(writing_line(step))
        try:
            return self._write(step, files, meta, blocked, t0)
        finally:
            _say(written_line(step))

    def _write(
        self, step: int, files: dict[str, Any], meta: dict[str, Any], blocked: float, t0: float
    ) -> SaveResult:
        if self.write == "inplace":
            final = self.root / INPLACE_SLOT
            work = final  # torn writes are the point of this mode
            final.mkdir(exist_ok=True)
        else:
            final = self.root / step_dir_name(step)
            work = self.root / temp_dir_name(step)
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
        entries: dict[str, dict[str, Any]] = {}
        for stem, state in files.items():
            path = work / f"{stem}.pt"
            # Serialise to memory once, hash those bytes, write them: no read-back pass.
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getbuffer()
            with open(path, "wb") as f:
                f.write(data)
                if self.write == "atomic":
                    f.flush()
                    os.fsync(f.fileno())
            entries[path.name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            del data, buf
        pause = self.pauses.get(step, 0.0)
        if pause:
            print(paused_line(step), file=sys.stderr)
            sys.stderr.flush()
            time.sleep(pause)
        if self.write == "atomic":
            if final.exists():  # re-saving a step after a resume: replace it whole
                shutil.rmtree(final)
            os.replace(work, final)
            fsync_dir(self.root)
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "files": entries,
            "created": time.time(),
            **meta,
        }
        tmp = final / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        if self.write == "atomic":
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final / MANIFEST)
        if self.write == "atomic":
            fsync_dir(final)
            self._prune()
        total = sum(e["bytes"] for e in entries.values())
        persist = time.perf_counter() - t0
        result = SaveResult(
            step,
            final,
            total,
            blocked if self.mode == "async" else persist,
            persist,
            tuple(meta["parts"]),
        )
        self._last = result
        if self.on_saved:
            self.on_saved(result)
        return result

    def _prune(self) -> None:
        # Cheap test (the manifest names its step) rather than re-hashing every kept one.
        done = [c.path for c in checkpoints(self.root.parent, check="manifest", slot=False)]
        for old in done[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)


def _say(line: str) -> None:
    print(line, file=sys.stderr)
    sys.stderr.flush()


def _estimate_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_estimate_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_estimate_bytes(v) for v in tree)
    return 8


# ---------------------------------------------------------------- reading


def load_files(info: CheckpointInfo) -> dict[str, Any]:
    """Every file of a verified checkpoint, loaded without unpickling code."""
    return {
        Path(name).stem: torch.load(info.path / name, map_location="cpu", weights_only=True)
        for name in info.manifest["files"]
    }


def load_model_state(run_dir: str | Path) -> dict[str, torch.Tensor]:
    """The weights of the newest valid checkpoint (for torch.equal comparisons)."""
    info = find_latest(run_dir)
    if info is None:
        raise FileNotFoundError(f"no complete checkpoint under {ckpt_root(run_dir)}")
    if info.manifest.get("layout") == "dcp":  # several ranks' shards
        from crashdrill.trainer.dcp_checkpoint import model_weights

        return model_weights(info)
    if info.manifest.get("layout") == "rank_files":  # trainer/rank_files_checkpoint.py
        whole = torch.load(info.path / rank_file_name(0), map_location="cpu", weights_only=True)
        return dict(whole["model"])  # every rank's file holds the same weights
    return dict(torch.load(info.path / "model.pt", map_location="cpu", weights_only=True))
