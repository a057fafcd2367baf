"""Where the lab's runs execute: the executor its settings name (`--executor local|ray`).

    executor = executor_for(settings)   # LocalExecutor by default; RayExecutor for "ray"
    cluster_status(executor)            # GET /api/health's `cluster`

The executor is chosen by name from workers/executor_registry.py; its module is
imported only then, so the default lab needs none of Ray. What cannot work is a
SettingsError naming the setting, so `serve` exits 2 with it: an executor not
installed, nothing listening at the cluster's address, a cluster that refuses the
connection. How runs live on a cluster is workers/ray_executor.py; docs/cluster.md says
how to point a lab at a real cluster, and how to write another executor.

`watch_cluster` wires an executor's cluster (its `cluster`, a ClusterView; None on the
local executor) to the lab's telemetry feed: the nodes' own samples and the cluster's
reachability.
"""

from __future__ import annotations

from typing import Any

from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.stream.telemetry_feed import TelemetryFeed
from crashdrill.workers.cluster_health import LOCAL
from crashdrill.workers.executor import Executor
from crashdrill.workers.executor_registry import ExecutorConfigError, create_executor


def executor_for(settings: Settings) -> Executor:
    """The executor the settings name; raises SettingsError naming what is wrong."""
    try:
        return create_executor(settings)
    except ExecutorConfigError as e:
        raise SettingsError(str(e)) from None


def cluster_status(executor: Executor) -> dict[str, Any]:
    """{"kind", "address", "reachable", "since", "last_ok", "error"}: the local executor's
    machine is always reachable."""
    if executor.cluster is None:
        return dict(LOCAL)
    return executor.cluster.health.status()


def watch_cluster(executor: Executor, feed: TelemetryFeed, settings: Settings) -> None:
    """Nodes sample themselves as often as the server's own sampler, and what they send
    and each change of reachability reach the feed (nothing to do on the local one)."""
    feed.cluster = lambda: cluster_status(executor)
    cluster = executor.cluster
    if cluster is None:
        return
    cluster.health.on_change = feed.cluster_changed_threadsafe
    cluster.telemetry = (
        {
            "interval_s": settings.telemetry_interval_s,
            "price_per_kwh": settings.price_per_kwh,
            "rent_per_hour": settings.rent_per_hour,
        }
        if settings.telemetry
        else None
    )
    cluster.on_node_sample = feed.node_sample_threadsafe
    feed.runs_on = cluster.runs_on
