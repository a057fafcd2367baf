"""The files of one run directory, as the supervisor and the server read and write them.

The layout is the trainer's contract (docs/run-contract.md); the files' names, and the
one reader of complete lines, are in trainer/run_files.py:

    DIR/records.jsonl          append-only run records, one JSON object a line
    DIR/run.json               {"pid", "started_at", "starts", ...}, rewritten at each start
    DIR/ckpt/step-00000150/    a checkpoint; which ones count is trainer/checkpoint_layout.py
    DIR/stdout.log, stderr.log the trainer's output (the supervisor's redirection)

Only the supervisor writes records here besides the trainer, and only while no trainer
process of the run is alive (a crash event after the kill, a failure after the exit), so
the two writers never interleave.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashdrill.trainer.checkpoint_layout import find_latest
from crashdrill.trainer.event_record import check_record
from crashdrill.trainer.record_contract import VERSION, to_json
from crashdrill.trainer.run_files import (
    RECORDS_FILE,
    RUN_JSON,
    STDERR_LOG,
    STDOUT_LOG,
    tail_records,
    torn_tail,
)


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def records(self) -> Path:
        return self.path / RECORDS_FILE

    @property
    def stdout(self) -> Path:
        return self.path / STDOUT_LOG

    @property
    def stderr(self) -> Path:
        return self.path / STDERR_LOG

    def run_json(self) -> dict[str, Any]:
        """The trainer's run.json, or {} when it is missing or half written."""
        try:
            data = json.loads((self.path / RUN_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def latest_checkpoint_step(self) -> int | None:
        """Step of the newest checkpoint whose manifest names it: a step directory or the
        slot that an in-place writer (ckpt_write = "inplace") overwrites.

        The trainer also checks every sha256 before it loads one and falls back to the
        previous checkpoint when the newest is corrupt; that costs a full read of the
        weights, so this cheap answer is for messages and the supervisor's restart, and
        the trainer's own `resume` record says where it really resumed.
        """
        info = find_latest(self.path, check="manifest")
        return info.step if info is not None else None

    def tail_records(self, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
        """The complete, parseable records among the last `max_bytes` of records.jsonl."""
        try:
            return tail_records(self.records, max_bytes)
        except OSError:
            return []

    def last_seen(self) -> tuple[int, int | None, str | None]:
        """(segment, last step, last stage) according to the end of records.jsonl."""
        segment, step, stage = 0, None, None
        for rec in self.tail_records():
            if isinstance(rec.get("segment"), int):
                segment = max(segment, rec["segment"])
            if rec.get("kind") == "step" and isinstance(rec.get("step"), int):
                step = rec["step"]
            if rec.get("kind") == "stage" and isinstance(rec.get("stage"), str):
                stage = rec["stage"]
        return segment, step, stage

    def append_records(self, records: list[dict[str, Any]]) -> None:
        """Append records (adding "v" and "t") as complete lines in one write.

        An event must be of a registered code with its fields (trainer/event_record.py's
        check_record, as the trainer's RecordWriter checks its own): else KeyError (an
        unknown code) or ValueError (its fields), and nothing is written. A trainer killed
        in the middle of a line leaves text without a newline; the write ends it first
        (trainer/run_files.py `torn_tail`), so that torn line stays one bad line that
        readers skip.
        """
        now = time.time()
        lines = []
        for rec in records:
            full = {"v": VERSION, "t": now, **rec}
            if full.get("kind") == "event":
                check_record(full)
            lines.append(to_json(full) + "\n")  # NaN, ±inf: null, as the trainer writes them
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.records, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, torn_tail(fd) + "".join(lines).encode())
        finally:
            os.close(fd)

    def stderr_tail(self, since: int = 0, max_lines: int = 20, max_bytes: int = 4096) -> str:
        """The last lines the trainer wrote to stderr after byte offset `since`."""
        try:
            with open(self.stderr, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(since, size - max_bytes)
                f.seek(start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line for line in text.splitlines() if line.strip()]
        if start > since and lines:
            lines = lines[1:]
        return "\n".join(lines[-max_lines:])

    def stderr_size(self) -> int:
        try:
            return self.stderr.stat().st_size
        except OSError:
            return 0

    def stderr_since(self, offset: int, limit: int = -1) -> bytes:
        """The trainer's stderr from byte `offset` (at most `limit` bytes; -1: all of it);
        b"" when there is none."""
        try:
            with open(self.stderr, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except OSError:
            return b""
