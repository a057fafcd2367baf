"""How long trainer starts take on this lab, measured by the trainers themselves.

    starts = StartTimes()
    starts.note_record(record)   # ingest: each new `step` record (a cheap text test first)
    starts.summary()             # {"median_s": 0.41, "count": 12}; median_s null: none yet

A trainer writes `startup_s` in the first step record of each process (docs/run-contract.md):
seconds from its process's start — a fork of the warm process, or an exec that imports
torch again — to that record. The lab keeps the newest KEEP of them, from every run, and
the page shows their median while a student waits for a start or a restart. Nothing is
made up: with no figure yet, the median is null. The figures live in memory: a server
restart starts counting again.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections import deque
from typing import Any

from crashdrill.server.storage.store import NewRecord

KEEP = 50  # the newest starts: recent enough to follow a lab that got busier
FIELD = "startup_s"
_MARK = f'"{FIELD}":'  # in the record's JSON text (written without spaces)


class StartTimes:
    """The newest starts' figures, lab-wide (written by ingest passes, read by requests)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._seconds: deque[float] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def note_record(self, record: NewRecord) -> None:
        """A stored record: a `step` record that carries the field adds its figure. Only
        those few are parsed (one per process start): every other record costs a
        substring test."""
        if record.kind != "step" or _MARK not in record.data:
            return
        try:
            value = json.loads(record.data).get(FIELD)
        except ValueError:
            return
        self.add(value)

    def add(self, seconds: Any) -> None:
        """One start's figure; anything but a finite positive number is ignored."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            return
        if not math.isfinite(seconds) or seconds <= 0:
            return
        with self._lock:
            self._seconds.append(float(seconds))

    def fastest(self) -> float | None:
        """The fastest of the newest starts (None with none): what a start takes here when
        the machine has room (server/admission.py compares the median with it)."""
        with self._lock:
            return min(self._seconds) if self._seconds else None

    def summary(self) -> dict[str, Any]:
        """`median_s` of the newest starts (null with none) and `count` of them."""
        with self._lock:
            figures = list(self._seconds)
        median = round(statistics.median(figures), 3) if figures else None
        return {"median_s": median, "count": len(figures)}
