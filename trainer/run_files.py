"""The files of a run dir, by name, and the one reader of their complete lines.

    records, end = read_records(DIR / RECORDS_FILE, offset)    # parsed objects; resume at `end`
    part = read_complete_lines(DIR / MIRROR_LOG, offset, limit=1 << 20)
    os.write(fd, torn_tail(fd) + line)                        # append after a torn last line
    for line_offset, line in part.lines(): ...                # each complete line, no newline
    next_offset = part.end
    recent = tail_records(DIR / RECORDS_FILE, max_bytes=256 * 1024)

Every process that touches a run dir — the trainer, the supervisor, the checkpoint
mirror, the server's ingest, the Ray node that ships a run's lines, the drill — names its
files from here (the layout is docs/run-contract.md's "Run dir"; which checkpoint
directories count is checkpoint_layout.py):

    DIR/records.jsonl   RECORDS_FILE   append-only run records, one JSON object a line
    DIR/run.json        RUN_JSON       {"pid", "started_at", "starts", ...}, rewritten at each start
    DIR/mirror.jsonl    MIRROR_LOG     the checkpoint mirror's records (its thread alone writes it)
    DIR/stop.json       STOP_MARKER    the newest graceful stop (trainer/preemption.py)
    DIR/ranks.json      RANKS_FILE     a group's launcher: its ranks' pids, a lost rank (ranks.py)
    DIR/preset.toml     FROZEN_PRESET  the preset text a frozen run trains (the lab writes it)
    DIR/stdout.log      STDOUT_LOG     the trainer's output (the supervisor's redirection)
    DIR/stderr.log      STDERR_LOG
    DIR/ckpt/           checkpoint_layout.CKPT_DIR

A JSONL file here has writers that append whole lines with one `os.write` each, so a
SIGKILL leaves at most a last line without its newline; the next writer to open the file
ends that fragment first (`torn_tail`: the trainer's RecordWriter, the supervisor's
RunDir.append_records), so it stays one bad line. Readers take complete lines only:
the bytes up to the last newline read, and the offset after it, from which the next read
resumes — a line split across two reads is read whole by the second one. A complete line
that is not a JSON object (the fragment a kill left, which the next writer ends with a
newline; bytes that are not UTF-8) is skipped by `read_records` and `tail_records`; the
server's ingest, which must count them, walks `lines()` itself. Stdlib only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORDS_FILE = "records.jsonl"
RUN_JSON = "run.json"
MIRROR_LOG = "mirror.jsonl"
STOP_MARKER = "stop.json"
# A run of several ranks: the launcher's pid, each rank's, the rank a rank crash kills, and
# the rank it lost (trainer/ranks.py writes it; the supervisor's rank crash reads it).
RANKS_FILE = "ranks.json"
# A run whose dir holds FROZEN_PRESET trains that preset text (an instructor's preset, a
# student's settings): it lives with the run, so it travels wherever the run dir does.
FROZEN_PRESET = "preset.toml"
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"


@dataclass(frozen=True)
class CompleteLines:
    """The complete lines of a file read at byte `start`: `data` is empty or ends with a
    newline; `read` is how many bytes the read returned (a last line without its newline
    is in `read` but not in `data`); `size` is the file's size then (-1: no such file)."""

    data: bytes
    start: int
    read: int = 0
    size: int = -1

    @property
    def end(self) -> int:
        """The offset after the last complete line: where the next read resumes."""
        return self.start + len(self.data)

    @property
    def more(self) -> bool:
        """The file held more than this read took up to its last newline."""
        return self.end < self.size

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(byte offset in the file, line without its newline) of each complete line."""
        pos = self.start
        for line in self.data.split(b"\n")[:-1]:
            yield pos, line
            pos += len(line) + 1


def complete_part(data: bytes, start: int, size: int = -1) -> CompleteLines:
    """`data` (read at byte `start` of a file of `size` bytes) up to its last newline."""
    end = data.rfind(b"\n")
    return CompleteLines(data[: end + 1], start, len(data), size)


def read_complete_lines(path: str | Path, offset: int = 0, limit: int = -1) -> CompleteLines:
    """The complete lines of `path` from byte `offset`, reading at most `limit` bytes
    (-1: to the end). A file that does not exist (yet) has no lines (size -1); any other
    OSError is raised."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return CompleteLines(b"", offset)
    return complete_part(data, offset, size)


def read_tail(path: str | Path, max_bytes: int) -> CompleteLines:
    """The complete lines among the last `max_bytes` of `path`; when that window starts
    inside the file its first line counts as cut and is left out. No file: no lines."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return CompleteLines(b"", 0)
    if start > 0:
        cut = data.find(b"\n") + 1  # 0 when there is no newline: nothing complete
        data, start = (data[cut:], start + cut) if cut else (b"", start + len(data))
    return complete_part(data, start, size)


def json_objects(part: CompleteLines) -> list[dict[str, Any]]:
    """The lines of `part` that are JSON objects; any other line is skipped."""
    out = []
    for _offset, line in part.lines():
        try:
            value = json.loads(line)
        except ValueError:  # UnicodeDecodeError too: bytes that are not UTF-8
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def torn_tail(fd: int) -> bytes:
    """What must precede the next line appended to the file open at `fd` (readable): b"\\n"
    when the file ends inside a line, the fragment of a writer killed mid-line, else b"".
    Written first (in the same `os.write` as the line, where the writer can), it ends the
    fragment as a line of its own, which readers skip, instead of the fragment swallowing
    the next record."""
    size = os.fstat(fd).st_size
    return b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""


def read_records(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The records in the complete lines of `path` from byte `offset`, and the offset
    after the last complete line (where the next call resumes)."""
    part = read_complete_lines(path, offset)
    return json_objects(part), part.end


def tail_records(path: str | Path, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
    """The records among the last `max_bytes` of `path` (complete lines only)."""
    return json_objects(read_tail(path, max_bytes))
