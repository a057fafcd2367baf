"""Run records: an append-only JSONL file in the run dir, the source of truth for
everything that shows a run (server, charts, resume checks, the drill). What each kind of
record holds is the contract in `record_contract.py`; this module writes and reads them.

Each record is one `os.write` of one line on an O_APPEND descriptor, so a SIGKILL leaves
at most a final line without its newline; readers take complete lines only (the one
reader, and the file's name, are in run_files.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from crashdrill.trainer.event_record import check_record, event

# The contract (kinds, fields, version, float32 bits) lives in record_contract, the file's
# name and its reader in run_files; these names are re-exported for the writer's users.
from crashdrill.trainer.record_contract import VERSION, bits_to_float32, float32_bits, to_json
from crashdrill.trainer.run_files import RECORDS_FILE, read_records, torn_tail

__all__ = [
    "CHECKPOINT_REFUSED_CODE",
    "NO_CHECKPOINT_CODE",
    "VERSION",
    "RecordWriter",
    "bits_to_float32",
    "float32_bits",
    "read_records",
]

# The event of a restart that refused to train without a checkpoint (--require-checkpoint);
# the lab reads a lesson's outcome from it (server/lessons/predictions.py).
NO_CHECKPOINT_CODE = "no_checkpoint"
# The event of a group that refused the checkpoint it found (another world size it cannot
# reshard, trainer/rank_loop.py): a refused restart too, for the lesson's outcome.
CHECKPOINT_REFUSED_CODE = "checkpoint_refused"


class RecordWriter:
    def __init__(self, run_dir: str | Path, segment: int) -> None:
        self.path = Path(run_dir) / RECORDS_FILE
        self.segment = segment
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        # A previous process killed mid-line left a fragment: the first record ends it, so
        # that the record starts on its own line (readers skip the fragment).
        self._torn = torn_tail(self._fd)

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        rec = {"v": VERSION, "kind": kind, "t": round(time.time(), 3), "segment": self.segment}
        rec.update(fields)
        if kind == "event":  # only registered codes with their fields (event_codes.py)
            check_record(rec)
        os.write(self._fd, self._torn + (to_json(rec) + "\n").encode())  # NaN, ±inf: null
        self._torn = b""
        return rec

    def event(
        self, code: str, text: str, level: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """An event of a registered code (trainer/event_codes.py): its fields are checked
        against the code's, so a new event cannot leave the contract."""
        built = event(code, text, level=level, **fields)
        del built["kind"]
        return self.write("event", **built)

    def close(self) -> None:
        os.close(self._fd)
