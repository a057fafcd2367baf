"""Which files of a checkpoint dir are checkpoints: the drill reads only those.

    files = CheckpointFiles()                       # recognised by name and content
    files = CheckpointFiles(["ckpt/*.pt"])          # --checkpoint-glob: only these count
    snap = files.scan(root)                         # checkpoint files and temp files only
    files.taken, files.ignored                      # every file seen, with why (the report)

Real output dirs hold more than checkpoints: TensorBoard event files appended at every
step, CSV/JSON logs, samples, `runs/`, `lightning_logs/`, `wandb/`. Such a file is never
progress, never "a checkpoint write" a kill landed in, never an in-place write. A file
counts, the way `crashdrill inspect` reads one (drill/checkpoint_open.py), when

- it lies in a checkpoint dir: Hugging Face `checkpoint-N/`, this project's `step-N/`,
  DeepSpeed's `global_stepN/` (anything in it but an event log);
- its name says a checkpoint format: torch.save (`.pt .pth .bin .ckpt .tar .pkl
  .pickle`), `.safetensors`, DCP (`.metadata`, `.distcp`), numpy (`.npy .npz`), or a
  `.json` whose name is not a log's (`metrics.json`, `history.json`, …);
- whatever its name, its first bytes say torch.save zip, pickle, numpy or safetensors
  (read once per (inode, size, mtime): the engine scans every 2 ms during a write).

Under a log dir (`runs/`, `wandb/`, `lightning_logs/`, `mlruns/`, `logs/`, …) only the
content counts: Lightning's `lightning_logs/version_0/checkpoints/*.ckpt` is a torch zip,
its `metrics.csv` and `hparams.yaml` are not. Temp files (`x.tmp`, `tmp…`, `x~`, anything
under a `*.tmp/` dir) are a checkpoint write in progress and stay in the snapshot, unless
they are a log's (`metrics.csv.tmp`) or lie under a log dir. With globs (`--checkpoint-glob`,
matched against the path relative to the checkpoint dir and against each folder above the
file) exactly the matching files count, and a temp file whose name matches once its temp
marks are taken off.
"""

from __future__ import annotations

import fnmatch
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from crashdrill.drill.checkpoint_open import TORCH_EXT  # the names inspect opens with torch
from crashdrill.drill.snapshot import TEMP_NAME, Snapshot, scan

CHECKPOINT_EXT = (*TORCH_EXT, ".safetensors", ".metadata", ".distcp", ".npy", ".npz")
LOG_EXT = (
    ".csv", ".tsv", ".log", ".txt", ".jsonl", ".ndjson", ".out", ".err", ".yaml", ".yml",
    ".png", ".jpg", ".jpeg", ".gif", ".svg", ".html", ".md", ".wandb", ".py", ".pyc", ".toml",
)  # fmt: skip
LOG_DIRS = frozenset(
    {"runs", "wandb", "lightning_logs", "mlruns", "tensorboard", "tb", "tb_logs", "logs",
     "log", "samples", "__pycache__", ".hydra"}
)  # fmt: skip
_EVENT_LOG = re.compile(r"^events\.out\.tfevents\.")
_CHECKPOINT_DIR = re.compile(r"^(checkpoint[-_]?\d+|step[-_]?\d+|global_step\d+)$")
_LOG_JSON = re.compile(
    r"log|metric|histor|result|stats|statistic|summar|event|loss|eval|sample|progress"
)
_TEMP_MARKS = re.compile(r"(\.(tmp|temp|part|partial|new)|~)$")

TAKEN, TEMP, IGNORED = "checkpoint", "temp", "ignored"


def _magic(path: str) -> str | None:
    """The checkpoint format the first bytes of a file say, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04"):
        return "a zip file (torch.save or numpy)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a pickle (legacy torch.save)"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy array"
    if len(head) >= 10 and head[8:10] == b'{"':
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n < 100_000_000:
            return "safetensors"
    return None


class CheckpointFiles:
    """Recognises checkpoint files under one root; remembers what it took and ignored."""

    def __init__(self, globs: Sequence[str] = ()) -> None:
        self.globs = [g.strip("/") for g in globs]
        self.taken: dict[str, str] = {}  # relative path → why it counts
        self.ignored: dict[str, str] = {}  # relative path → why it does not
        self.temps: set[str] = set()  # temp files of writes seen
        self._cache: dict[str, tuple[tuple[int, int, int], str, str]] = {}

    def scan(self, root: Path) -> Snapshot:
        """The checkpoint files and temp files under `root` (see the module docstring)."""
        snap = scan(root)
        out: Snapshot = {}
        for rel, st in snap.items():
            kind = self.kind(rel, os.path.join(root, rel), st)
            if kind != IGNORED:
                out[rel] = st
        return out

    def kind(self, rel: str, path: str, st: tuple[int, int, int]) -> str:
        cached = self._cache.get(rel)
        if cached is not None and cached[0] == st:
            return cached[1]
        kind, why = self._judge(rel, path)
        self._cache[rel] = (st, kind, why)
        if kind == TEMP:
            self.temps.add(rel)
        elif kind == TAKEN:
            self.taken[rel] = why
            self.ignored.pop(rel, None)
        elif rel not in self.taken:
            self.ignored[rel] = why
        return kind

    def _judge(self, rel: str, path: str) -> tuple[str, str]:
        parts = rel.split("/")
        name, folders = parts[-1], parts[:-1]
        temp = bool(TEMP_NAME.search(rel))
        if self.globs:
            if self._matches(rel):
                return (TEMP if temp else TAKEN), "matches --checkpoint-glob"
            bare = "/".join(_TEMP_MARKS.sub("", p) for p in parts)
            if temp and bare != rel and self._matches(bare):
                return TEMP, "a temp file of a write"
            return IGNORED, "matches no --checkpoint-glob"
        if _EVENT_LOG.match(name):
            return IGNORED, "a TensorBoard event log"
        log_dir = next((f for f in folders if f in LOG_DIRS), None)
        if log_dir is not None:
            found = _magic(path)
            if found and not temp:
                return TAKEN, f"{found}, under {log_dir}/"
            return IGNORED, f"under {log_dir}/, a log dir, and not a checkpoint by content"
        in_dir = next((f for f in folders if _CHECKPOINT_DIR.match(f)), None)
        if in_dir is not None:
            return (TEMP if temp else TAKEN), f"in the checkpoint dir {in_dir}/"
        bare_name = _TEMP_MARKS.sub("", name)
        if bare_name.endswith(LOG_EXT) or _EVENT_LOG.match(bare_name):
            return IGNORED, f"a log or text file ({os.path.splitext(bare_name)[1]})"
        if temp:
            return TEMP, "a temp file of a write"
        if name.endswith(CHECKPOINT_EXT):
            return TAKEN, f"a checkpoint by its name ({os.path.splitext(name)[1]})"
        if name.endswith(".json"):
            if _LOG_JSON.search(name.lower()):
                return IGNORED, "a JSON log by its name"
            return TAKEN, "a JSON checkpoint by its name"
        found = _magic(path)
        if found:
            return TAKEN, found
        return IGNORED, "not a checkpoint format (by name or first bytes)"

    def _matches(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(fnmatch.fnmatchcase(p, g) for g in self.globs for p in prefixes)

    def to_json(self) -> dict[str, object]:
        return {
            "globs": list(self.globs),
            "taken": [{"path": k, "why": v} for k, v in sorted(self.taken.items())],
            "ignored": [{"path": k, "why": v} for k, v in sorted(self.ignored.items())],
            "temp_files": len(self.temps),
        }


def check_globs(globs: Sequence[str]) -> list[str]:
    """The globs as given, or ValueError naming one that cannot match a relative path."""
    for g in globs:
        if not g.strip() or g.startswith("/") or ".." in g.split("/"):
            raise ValueError(
                f"--checkpoint-glob {g!r}: a pattern relative to the checkpoint dir "
                "(e.g. 'model.pt', '*.ckpt', 'checkpoint-*'), not empty, absolute or with '..'"
            )
    return list(globs)
