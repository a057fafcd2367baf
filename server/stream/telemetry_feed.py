"""One machine telemetry sampler per server, wired into the records path.

The sampler (`crashdrill.workers.telemetry`) calls back from its own thread; each sample
becomes a `telemetry` record, is stored (the newest `telemetry_keep` are kept), served at
/api/machine and pushed on every stream as a latest value.

On a Ray cluster each node samples itself (workers/node_telemetry.py) and its sample,
the same record with `"node": {"node_id", "name"}`, reaches `node_sample_threadsafe`: it
is kept in memory (the newest per node, not stored: it is a live value) and pushed only
to the streams of the pairs with a run on that node (on those runs' channels, key
`node:ID`). `for_pair` picks the samples of a pair's nodes for the stream's hello and
/api/machine?pair=. The cluster's reachability (workers/cluster_health.py) goes out on
the machine channel as a `telemetry` message `{"cluster": {...}}` (key `cluster`) each
time it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from crashdrill.server.settings import Settings
from crashdrill.server.storage.db import DatabaseUnavailable
from crashdrill.server.storage.store import Store
from crashdrill.server.stream.fanout import Fanout, Message
from crashdrill.workers.cluster_health import LOCAL

log = logging.getLogger(__name__)

MACHINE_CHANNEL = "machine"


class Sample(Protocol):
    def to_record(self) -> dict[str, Any]: ...


class Sampler(Protocol):
    def start(self, callback: Callable[[Any], None], interval_s: float = ...) -> None: ...

    def stop(self) -> None: ...


def default_sampler(settings: Settings) -> Sampler | None:
    try:
        from crashdrill.workers.telemetry import TelemetrySampler
    except ImportError as e:  # psutil or the module missing: the lab works without it
        log.warning("machine telemetry is off: %s", e)
        return None
    return TelemetrySampler(
        price_per_kwh=settings.price_per_kwh, rent_per_hour=settings.rent_per_hour
    )


class TelemetryFeed:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        fanout: Fanout,
        sampler_factory: Callable[[Settings], Sampler | None] = default_sampler,
    ) -> None:
        self.settings = settings
        self.store = store
        self.fanout = fanout
        self.sampler_factory = sampler_factory
        self._sampler: Sampler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.latest: dict[str, Any] | None = None
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> its newest sample
        self.runs_on: Callable[[str], list[str]] = lambda node_id: []  # the executor's
        self.cluster: Callable[[], dict[str, Any]] = lambda: dict(LOCAL)
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        row = self.store.latest_telemetry()
        if row is not None:
            self.latest = json.loads(row["data"])
        if not self.settings.telemetry:
            return
        self._sampler = self.sampler_factory(self.settings)
        if self._sampler is not None:
            self._sampler.start(self._on_sample_threadsafe, self.settings.telemetry_interval_s)

    def stop(self) -> None:
        self._stopped = True
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            close = getattr(sampler, "close", None)
            (close or sampler.stop)()

    def _on_sample_threadsafe(self, sample: Sample) -> None:
        """On the sampler's thread: store the sample there (a remote database's round
        trip must not stall the loop), then push it from the loop's thread."""
        loop = self._loop
        if self._stopped or loop is None or loop.is_closed():
            return
        try:
            record, data = self._store(sample.to_record())
        except DatabaseUnavailable as e:  # ingest says so, once; the next sample tries again
            log.debug("telemetry sample not stored: %s", e)
            return
        except Exception:
            if not self._stopped:
                log.exception("telemetry sample not stored")
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._publish, record, data)

    def add(self, record: dict[str, Any]) -> None:
        """Store one telemetry record and push it (on the loop's thread)."""
        if self._stopped:
            return  # a sample that was on its way when the feed stopped
        self._publish(*self._store(record))

    def _store(self, record: dict[str, Any]) -> tuple[dict[str, Any], str]:
        record = {"v": 1, "kind": "telemetry", **record}
        record.setdefault("t", time.time())
        data = json.dumps(record, separators=(",", ":"))
        self.store.insert_telemetry(float(record["t"]), data, self.settings.telemetry_keep)
        return record, data

    def _publish(self, record: dict[str, Any], data: str) -> None:
        if self._stopped:
            return  # a sample that was on its way when the feed stopped
        self.latest = record
        message = Message(event="telemetry", key="machine", data=data)
        self.fanout.publish(MACHINE_CHANNEL, message)

    # ---- the nodes of a cluster ------------------------------------------------------

    def for_pair(self, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The newest samples of the nodes this pair's runs are on (its view's runs)."""
        return pair_nodes(runs, self.nodes)

    def node_sample_threadsafe(self, record: dict[str, Any]) -> None:
        """From the executor's thread that shipped it: push it from the loop's thread."""
        self._soon(self._publish_node, record)

    def cluster_changed_threadsafe(self, status: dict[str, Any]) -> None:
        self._soon(self._publish_cluster, status)

    def _soon(self, fn: Callable[[dict[str, Any]], None], arg: dict[str, Any]) -> None:
        loop = self._loop
        if self._stopped or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, arg)

    def _publish_node(self, record: dict[str, Any]) -> None:
        node_id = str(record["node"]["node_id"])
        self.nodes[node_id] = record
        data = json.dumps(record, separators=(",", ":"))
        message = Message(event="telemetry", key=f"node:{node_id}", data=data)
        for run_id in self.runs_on(node_id):
            self.fanout.publish(f"run:{run_id}", message)

    def _publish_cluster(self, status: dict[str, Any]) -> None:
        if self._stopped:
            return
        data = json.dumps({"cluster": status}, separators=(",", ":"))
        self.fanout.publish(MACHINE_CHANNEL, Message(event="telemetry", key="cluster", data=data))


def pair_nodes(
    runs: list[dict[str, Any]], samples: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One sample per node that a run of the pair is on (runs as the pair's view has them,
    with `host`), in the runs' order; nodes without a sample yet are left out."""
    picked: dict[str, dict[str, Any]] = {}
    for run in runs:
        node_id = (run.get("host") or {}).get("node_id")
        if node_id in samples and node_id not in picked:
            picked[node_id] = samples[node_id]
    return list(picked.values())
