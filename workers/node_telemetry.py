"""A Ray node's own telemetry: one sampler per node, whatever the number of run actors.

    node = NodeTelemetry(node_root(node_id), Host(node_id, name))
    record = node.due(interval_s=2.0)   # a `telemetry` record with "node", or None

Every run actor on a node (workers/ray_node.py's NodeRun) asks `due` on each poll; one of
them holds the node's sampler lock (an flock on ROOT/telemetry.lock, kept while its
process lives) and only that one samples, at most once per interval, and returns the
sample: so no telemetry leaves a node more than once per interval, however many runs train
there. One long-lived sampler (not one per poll) keeps the rate baselines and the energy
counter continuous. When the holder's actor ends (its run finished, its node is killed),
the kernel drops the lock and the next actor to poll takes over with a fresh sampler (its
first sample has no rates, and its energy counts from zero again; the page counts only
increases). The newest sample is also written, atomically, to ROOT/telemetry.json for
whoever on the node wants to read it (`cat` it on a node).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashdrill.workers.executor import Host

log = logging.getLogger(__name__)

LOCK = "telemetry.lock"
LATEST = "telemetry.json"


class NodeTelemetry:
    """The node's sampler, if this process holds the node's lock (see the module doc)."""

    def __init__(
        self,
        root: Path,
        host: Host,
        sampler_factory: Callable[[float, float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.host = host
        self._sampler_factory = sampler_factory or _psutil_sampler
        self._clock = clock
        self._lock_fd: int | None = None
        self._sampler: Any = None
        self._last_at: float | None = None
        self._broken = False  # psutil missing or NVML failed to load: stays quiet

    def due(
        self, interval_s: float, price_per_kwh: float = 0.15, rent_per_hour: float = 0.0
    ) -> dict[str, Any] | None:
        """A new sample of this node when this process samples it and `interval_s` has
        passed since its last one; else None."""
        if self._broken or not self._hold_lock():
            return None
        now = self._clock()
        if self._last_at is not None and now - self._last_at < interval_s:
            return None
        try:
            if self._sampler is None:
                self._sampler = self._sampler_factory(price_per_kwh, rent_per_hour)
            record: dict[str, Any] = self._sampler.sample().to_record()
        except Exception as e:  # telemetry is a side channel: the run goes on without it
            log.warning("node telemetry is off on %s: %s", self.host.name, e)
            self._broken = True
            return None
        self._last_at = now
        record["node"] = self.host.to_dict()
        self._write_latest(record)
        return record

    def close(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            with contextlib.suppress(Exception):
                sampler.close()
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # drops the flock: another actor on the node takes over

    def _hold_lock(self) -> bool:
        if self._lock_fd is not None:
            return True
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another actor on this node samples it
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _write_latest(self, record: dict[str, Any]) -> None:
        tmp = self.root / f".{LATEST}.{os.getpid()}"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(record, separators=(",", ":")))
            os.replace(tmp, self.root / LATEST)


def _psutil_sampler(price_per_kwh: float, rent_per_hour: float) -> Any:
    from crashdrill.workers.telemetry import TelemetrySampler

    return TelemetrySampler(price_per_kwh=price_per_kwh, rent_per_hour=rent_per_hour)
