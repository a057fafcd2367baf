"""Whether the cluster the runs execute on answers: what the lab and the page say about it.

    health = ClusterHealth("ray", "head:6379", on_change=print)
    health.ok()                       # a call to the cluster answered
    health.failed("GetTimeoutError: …")   # one timed out or found the cluster unavailable
    health.status()   # {"kind", "address", "reachable", "since", "last_ok", "error"}

The Ray executor (workers/ray_executor.py) reports every call to an actor here. While the
cluster is unreachable the runs keep training on their nodes and nothing is lost: the
records are shipped by offset once a call answers again. `since` is when the current
outage began (null while reachable); `on_change` is called, on the caller's thread, on
each change of `reachable` only, so the page gets one message per outage and one at its
end. The local executor's status is `LOCAL`: this machine is always reachable.

    cluster = ClusterNodes("ray", "head:6379", runs_on=executor.runs_on)
    cluster.took_sample(record)       # a node's own sample: kept if newest, told once

`ClusterNodes` is what an executor on a cluster exposes as its `cluster` (the ClusterView
of workers/executor.py): this health, the nodes' newest telemetry samples, and which runs
each node holds; the server wires it to the telemetry feed (server/cluster.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

LOCAL: dict[str, Any] = {
    "kind": "local",
    "address": None,
    "reachable": True,
    "since": None,
    "last_ok": None,
    "error": None,
}


class ClusterHealth:
    def __init__(
        self,
        kind: str,
        address: str | None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kind = kind
        self.address = address
        self.on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the current outage began
        self._last_ok: float | None = None
        self._error: str | None = None

    def ok(self) -> None:
        with self._lock:
            was_failing = self._since is not None
            self._last_ok = self._clock()
            self._since = None
            self._error = None
            status = self._status()
        if was_failing:
            self._changed(status)

    def failed(self, error: str) -> None:
        with self._lock:
            began = self._since is None
            if began:
                self._since = self._clock()
            self._error = error
            status = self._status()
        if began:
            self._changed(status)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "address": self.address,
            "reachable": self._since is None,
            "since": self._since,
            "last_ok": self._last_ok,
            "error": self._error,
        }

    def _changed(self, status: dict[str, Any]) -> None:
        if self.on_change is not None:
            self.on_change(status)


class ClusterNodes:
    """The cluster as the lab sees it (workers/executor.py's ClusterView): whether it
    answers, the nodes' newest samples, and which runs each node holds."""

    def __init__(self, kind: str, address: str | None, runs_on: Callable[[str], list[str]]) -> None:
        self.health = ClusterHealth(kind, address)
        # What a node samples of itself ({"interval_s", "price_per_kwh", "rent_per_hour"});
        # None: nodes sample nothing. The server sets it and `on_node_sample`.
        self.telemetry: dict[str, float] | None = {"interval_s": 2.0}
        self.on_node_sample: Callable[[dict[str, Any]], None] | None = None
        self.node_samples: dict[str, dict[str, Any]] = {}  # node id -> newest sample
        self.runs_on = runs_on
        self._lock = threading.Lock()

    def took_sample(self, record: dict[str, Any] | None) -> None:
        """A poll's node sample: kept when it is the node's newest, and told once."""
        node = (record or {}).get("node") or {}
        if not record or not node.get("node_id"):
            return
        with self._lock:
            newest = self.node_samples.get(node["node_id"])
            if newest is not None and newest.get("t", 0) >= record.get("t", 0):
                return
            self.node_samples[node["node_id"]] = record
        if self.on_node_sample is not None:
            self.on_node_sample(record)
