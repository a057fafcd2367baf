"""Where a `data = "file:PATH"` corpus may be read from (no torch: the server checks it too).

    path = corpus_file("file:notes.txt", Path("/srv/lab/corpora"))  # or CorpusPathError

A lab's presets are written by instructors and started by students, and a trainer's samples
are shown on a page, so `file:` must not reach /proc/self/environ, /dev/zero or the server's
files. When a corpora directory is configured (the lab always configures one: the
CRASHDRILL_CORPORA_DIR it hands its trainers), a `file:` path, relative to it or absolute,
must resolve, symlinks followed, to a regular file inside it. The server checks a preset
when it is validated and when a pair starts; the trainer checks again when it opens the
file (`open_corpus`), which it does without following a last-component symlink. A headless
`crashdrill run` without CRASHDRILL_CORPORA_DIR reads any file its user names.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CORPORA_DIR_VARIABLE = "CRASHDRILL_CORPORA_DIR"


class CorpusPathError(ValueError):
    """A `file:` corpus outside the corpora directory, or not a regular file."""


def corpora_dir_from_environ() -> Path | None:
    value = os.environ.get(CORPORA_DIR_VARIABLE, "").strip()
    return Path(value).expanduser() if value else None


def corpus_file(source: str, corpora_dir: Path | None, *, must_exist: bool = True) -> Path:
    """The file that `source` ("file:PATH") names, resolved; with a `corpora_dir`, only a
    regular file inside it (CorpusPathError naming the data setting and what is allowed)."""
    if not source.startswith("file:"):
        raise CorpusPathError(f"data = {source!r} is not a file: source")
    raw = Path(source[5:]).expanduser()
    if corpora_dir is None:
        return raw
    root = Path(os.path.realpath(corpora_dir))
    resolved = Path(os.path.realpath(root / raw))  # an absolute `raw` stays itself
    allowed = f"a text file inside the corpora directory {root} (CRASHDRILL_CORPORA_DIR)"
    if resolved != root and root not in resolved.parents:
        raise CorpusPathError(f"data = {source!r}: outside the corpora directory; use {allowed}")
    if not must_exist and not resolved.exists():
        return resolved
    try:
        mode = os.stat(resolved).st_mode
    except FileNotFoundError:
        raise CorpusPathError(f"data = {source!r}: no such file; use {allowed}") from None
    if not stat.S_ISREG(mode):
        raise CorpusPathError(f"data = {source!r}: not a regular file; use {allowed}")
    return resolved


def open_corpus(source: str, corpora_dir: Path | None) -> bytes:
    """The bytes of a `file:` corpus, checked as corpus_file does and opened without
    following a symlink put in place of the checked file meanwhile."""
    path = corpus_file(source, corpora_dir)
    if corpora_dir is None:
        return path.read_bytes()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CorpusPathError(f"data = {source!r}: not a regular file")
        return f.read()
