"""A database outage, told once: that the database went away, and that it came back.

    outage = Outage(log)
    outage.failed(error)   # every failed attempt (ingest retries every few hundred ms)
    outage.ok()            # every attempt that worked: the end of an outage is logged

Not once per statement that failed meanwhile. Thread-safe: the ingest loop, the
scheduler, the supervisors' reports and the request handlers all report to one tracker.
"""

from __future__ import annotations

import logging
import threading
import time


class Outage:
    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._since: float | None = None
        self.failures = 0  # failed attempts in the current outage

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self.failures += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        self._log.warning(
            "the database is unreachable (%s); the lab retries with backoff. Runs keep"
            " training: their records wait in the run dirs and are stored once it is back",
            error,
        )

    def ok(self) -> None:
        if self._since is None:
            return
        with self._lock:
            since, self._since = self._since, None
            failures, self.failures = self.failures, 0
        if since is not None:
            self._log.info(
                "the database is reachable again after %.1f s (%d failed attempts); ingest"
                " catches up",
                time.monotonic() - since,
                failures,
            )
