"""Which files of a checkpoint dir are checkpoints: the drill reads only those.

    files = CheckpointFiles()                       # recognised by name and content
    files = CheckpointFiles(["ckpt/*.pt"])          # --checkpoint-glob: only these count
    snap = files.scan(root)                         # checkpoint files and temp files only
    files.taken, files.ignored                      # every file seen, with why (the report)

Real output dirs hold more than checkpoints: TensorBoard event files appended at every
step, CSV/JSON logs, samples, configs written at every start, `runs/`, `lightning_logs/`,
`wandb/`. Such a file is never progress, never "a checkpoint write" a kill landed in, never
an in-place write. A file counts by its content, the way `crashdrill inspect` reads one
(drill/checkpoint_open.py), when

- it lies in a checkpoint dir: Hugging Face `checkpoint-N/`, this project's `step-N/`,
  DeepSpeed's `global_stepN/` (anything in it but an event log);
- its first bytes say torch.save zip (or numpy .npz), a pickle (legacy torch.save, DCP's
  `.metadata`), numpy .npy or safetensors, whatever its name (read once per (inode, size,
  mtime): the engine scans every 2 ms during a write). A checkpoint's name (`.pt .pth
  .bin .ckpt .tar .pkl .pickle .safetensors .metadata .npy .npz`) is not enough: such a
  file counts while it is empty or once was a checkpoint (a write under way, or torn), not
  when its bytes are text or a raw array; a DCP shard (`.distcp`, raw tensor bytes) counts;
- it is a `.json` a script keeps its state in: not a log's name (`metrics.json`,
  `history.json`, …), not a config's (`config.json`, `args.json`, `hparams.json`,
  `trainer_state.json` beside the checkpoints, tokenizer files: written at a start, never a
  checkpoint); one that does not parse (yet) is a write under way, or torn.

A JSON file is progress only when what it says changed (`advanced`): the training position
it holds (an integer `step`, `global_step`, `iter`, `iter_num`, `iteration` or
`num_updates`, at its top or one level down, with `epoch` beside it), else its bytes. A
state file rewritten at every start with the step it had, a restart that crashes after
rewriting it, got nowhere.

Under a log dir (`runs/`, `wandb/`, `lightning_logs/`, `mlruns/`, `logs/`, …) only the
binary formats count: Lightning's `lightning_logs/version_0/checkpoints/*.ckpt` is a torch
zip, its `metrics.csv` and `hparams.yaml` are not. Temp files (`x.tmp`, `tmp…`, `x~`,
anything under a `*.tmp/` dir) are a checkpoint write in progress and stay in the snapshot,
unless they are a log's or a config's (`metrics.csv.tmp`) or lie under a log dir. With globs
(`--checkpoint-glob`, matched against the path relative to the checkpoint dir and against
each folder above the file) exactly the matching files count, and a temp file whose name
matches once its temp marks are taken off.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashdrill.drill.checkpoint_open import TORCH_EXT  # the names inspect opens with torch
from crashdrill.drill.file_sniff import sniff
from crashdrill.drill.snapshot import TEMP_NAME, Snapshot, final_names, scan

CHECKPOINT_EXT = (*TORCH_EXT, ".safetensors", ".metadata", ".distcp", ".npy", ".npz")
LOG_EXT = (
    ".csv", ".tsv", ".log", ".txt", ".jsonl", ".ndjson", ".out", ".err", ".yaml", ".yml",
    ".png", ".jpg", ".jpeg", ".gif", ".svg", ".html", ".md", ".wandb", ".py", ".pyc", ".toml",
)  # fmt: skip
LOG_DIRS = frozenset(
    {"runs", "wandb", "lightning_logs", "mlruns", "tensorboard", "tb", "tb_logs", "logs",
     "log", "samples", "__pycache__", ".hydra"}
)  # fmt: skip
# The keys that name where training is: a JSON checkpoint advanced when one of them did.
POSITION_KEYS = ("step", "global_step", "iter", "iter_num", "iteration", "epoch", "num_updates")
MAX_JSON_BYTES = 64 << 20  # a bigger JSON is not parsed: compared by (inode, size, mtime)
_EVENT_LOG = re.compile(r"^events\.out\.tfevents\.")
_CHECKPOINT_DIR = re.compile(r"^(checkpoint[-_]?\d+|step[-_]?\d+|global_step\d+)$")
_LOG_JSON = re.compile(
    r"log|metric|histor|result|stats|statistic|summar|event|loss|eval|sample|progress"
)
# Written at a start (or beside the checkpoints), never a checkpoint: configs, argparse
# dumps, tokenizer files, and Hugging Face's top-level trainer_state.json (save_state()).
_CONFIG_JSON = re.compile(
    r"(^|[_.-])(config|configs|cfg|args|arguments|hparams|hyperparams?|hyperparameters"
    r"|params|parameters|settings|options|opts)([_.-]|$)"
    r"|^(trainer_state|tokenizer\w*|vocab|special_tokens_map|added_tokens|merges)$"
)
_TEMP_MARKS = re.compile(r"(\.(tmp|temp|part|partial|new)|~)$")

TAKEN, TEMP, IGNORED = "checkpoint", "temp", "ignored"
Position = tuple[tuple[str, int], ...]  # the position keys a JSON checkpoint holds


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


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def json_position(obj: Any) -> Position | None:
    """The training position a parsed JSON names (its int POSITION_KEYS, at its top or
    one level down), or None."""
    if not isinstance(obj, dict):
        return None
    found = [(k, v) for k, v in obj.items() if k in POSITION_KEYS and type(v) is int]
    for name, sub in obj.items():
        if isinstance(sub, dict):
            found += [(f"{name}.{k}", v) for k, v in sub.items()
                      if k in POSITION_KEYS and type(v) is int]  # fmt: skip
    return tuple(sorted(found)) or None


def _read_json(path: str) -> tuple[bool, Any, str | None]:
    """(parsed, the object, a digest of its bytes): not parsed for an empty, torn or
    half-written file; no digest for one too big to read."""
    if _size(path) > MAX_JSON_BYTES:
        return True, None, None
    try:
        with open(path, "rb") as f:
            raw = f.read()
        return True, json.loads(raw), hashlib.sha1(raw).hexdigest()
    except (OSError, ValueError):
        return False, None, None


class CheckpointFiles:
    """Recognises checkpoint files under one root; remembers what it took and ignored."""

    def __init__(self, globs: Sequence[str] = ()) -> None:
        self.globs = [g.strip("/") for g in globs]
        self.taken: dict[str, str] = {}  # relative path → why it counts
        self.ignored: dict[str, str] = {}  # relative path → why it does not
        self.temps: set[str] = set()  # temp files of writes seen
        self._cache: dict[str, tuple[tuple[int, int, int], str, str]] = {}
        self._st: tuple[int, int, int] = (0, 0, 0)  # of the file being judged
        # (path, (inode, size, mtime)) → what that version of a JSON checkpoint says: the
        # position it holds, else a digest of its bytes
        self._says: dict[tuple[str, tuple[int, int, int]], Position | str] = {}

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
        self._st = st
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

    def advanced(self, before: Snapshot | None, after: Snapshot | None) -> bool:
        """Does `after` hold a checkpoint `before` did not? Files under final names
        compared by (inode, size, mtime), a JSON checkpoint by what it says (the position
        it holds, else its bytes): one rewritten at a start as it was is no progress."""
        b, a = final_names(before), final_names(after)
        if not a:
            return False

        def identity(snap: Snapshot, rel: str) -> object:
            st = snap[rel]
            return self._says.get((rel, st), st)

        assert after is not None
        return {k: identity(after, k) for k in a} != (
            {k: identity(before, k) for k in b} if before else {}
        )

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
        if bare_name.endswith(".json"):
            stem = bare_name[: -len(".json")].lower()
            if _CONFIG_JSON.search(stem):
                return IGNORED, "a config by its name (written at a start, not a checkpoint)"
            if _LOG_JSON.search(stem):
                return IGNORED, "a JSON log by its name"
        if temp:
            return TEMP, "a temp file of a write"
        if name.endswith(".json"):
            return self._judge_json(rel, path)
        found = _magic(path)
        if found:
            return TAKEN, found
        ext = next((e for e in CHECKPOINT_EXT if name.endswith(e)), None)
        if ext is None:
            return IGNORED, "not a checkpoint format (by name or first bytes)"
        if ext == ".distcp":
            return TAKEN, "a DCP shard (.distcp)"
        if _size(path) == 0:
            return TAKEN, f"an empty {ext}: a checkpoint write under way, or torn"
        if rel in self.taken:
            return TAKEN, "a checkpoint before, its bytes not one now: a write under way, or torn"
        try:
            what = sniff(Path(path)).what
        except OSError:
            what = "unreadable"
        return IGNORED, (
            f"named {ext}, but its bytes are not a checkpoint format (it looks like {what}); "
            "--checkpoint-glob takes it anyway"
        )

    def _judge_json(self, rel: str, path: str) -> tuple[str, str]:
        parsed, obj, digest = _read_json(path)
        if not parsed:
            return TAKEN, "JSON that does not parse: a checkpoint write under way, or torn"
        if digest is None:
            return TAKEN, f"a JSON document over {MAX_JSON_BYTES >> 20} MiB, not read"
        position = json_position(obj)
        # An epoch alone is too coarse: a script may save several times in one epoch.
        steps = position is not None and any(not k.endswith("epoch") for k, _ in position)
        self._says[(rel, self._st)] = position if position is not None and steps else digest
        if position:
            return TAKEN, f"a JSON checkpoint: it holds a training position ({position[0][0]})"
        return TAKEN, "a JSON document with no training position: compared by its bytes"

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
