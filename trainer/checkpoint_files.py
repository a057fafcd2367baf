"""The checkpoint layout's names and file primitives, without torch: the mirror
(workers/mirror*.py) reads and writes the same directories as checkpoint.py, and
imports these so that it never imports torch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO

MANIFEST = "MANIFEST.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(f: IO[bytes]) -> str:
    """The sha256 of the whole of open file `f`, read from its start in 1 MiB chunks."""
    h = hashlib.sha256()
    f.seek(0)
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()
