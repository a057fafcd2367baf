"""File primitives of the checkpoint writers and readers, without torch: the trainer
(checkpoint.py), the layout's verification (checkpoint_layout.py) and the mirror
(workers/mirror*.py) share them, and the mirror never imports torch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO


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
