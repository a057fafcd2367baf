"""Where the lab's runs execute: this machine (the default) or a Ray cluster.

    executor = executor_for(settings)   # LocalExecutor, or RayExecutor when settings.ray

`crashdrill serve --ray ADDRESS` (or CRASHDRILL_RAY_ADDRESS) connects the server to the
cluster at startup; what cannot work is a SettingsError naming the setting, so `serve`
exits 2 with it: Ray not installed, nothing listening at the address, or a cluster that
refuses the connection. Ray is imported only here and only then: the default lab needs
none of it. How runs live on the cluster is workers/ray_executor.py; docs/cluster.md says
how to point a lab at a real cluster.

`watch_cluster` wires a Ray executor to the lab's telemetry feed: the nodes' own samples
and the cluster's reachability (`cluster_status`, also in GET /api/health).
"""

from __future__ import annotations

from typing import Any

from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.telemetry_feed import TelemetryFeed
from crashdrill.workers.cluster_health import LOCAL
from crashdrill.workers.executor import Executor, LocalExecutor
from crashdrill.workers.warm import WarmTrainers, forkable


def executor_for(settings: Settings) -> Executor:
    """The executor the settings ask for; raises SettingsError naming what is wrong."""
    if settings.ray is None:
        # The built-in trainer forks from a warm process (CRASHDRILL_WARM_TRAINERS=0: exec);
        # trainers outlive the server as exec'd ones do, for the next one to adopt.
        enabled = forkable(settings.trainer_command)
        return LocalExecutor(WarmTrainers(keep_children=True, enabled=enabled))
    mirror = settings.mirror_url
    if mirror is None:  # Settings refuses this already; kept for a hand-built Settings
        raise SettingsError(f"ray = {settings.ray!r} needs a checkpoint mirror (--mirror)")
    try:
        from crashdrill.workers.ray_executor import ExecutorError, RayExecutor
    except ImportError as e:
        raise SettingsError(
            f"ray = {settings.ray!r}: Ray is not installed ({e}); install it with"
            " .venv/bin/pip install -e '.[ray]'"
        ) from None
    try:
        return RayExecutor.connect(settings.ray, mirror)
    except ExecutorError as e:
        where = "--ray, CRASHDRILL_RAY_ADDRESS"
        raise SettingsError(f"ray = {settings.ray!r} ({where}): {e}") from None


def cluster_status(executor: Executor) -> dict[str, Any]:
    """{"kind", "address", "reachable", "since", "last_ok", "error"}: the local executor's
    machine is always reachable."""
    health = getattr(executor, "health", None)
    return health.status() if health is not None else dict(LOCAL)


def watch_cluster(executor: Executor, feed: TelemetryFeed, settings: Settings) -> None:
    """Nodes sample themselves as often as the server's own sampler, and what they send
    and each change of reachability reach the feed (nothing to do on the local one)."""
    feed.cluster = lambda: cluster_status(executor)
    health = getattr(executor, "health", None)
    if health is not None:
        health.on_change = feed.cluster_changed_threadsafe
    if hasattr(executor, "on_node_sample"):
        on = settings.telemetry
        executor.telemetry = (  # type: ignore[attr-defined]
            {
                "interval_s": settings.telemetry_interval_s,
                "price_per_kwh": settings.price_per_kwh,
                "rent_per_hour": settings.rent_per_hour,
            }
            if on
            else None
        )
        executor.on_node_sample = feed.node_sample_threadsafe  # type: ignore[attr-defined]
        feed.runs_on = executor.runs_on  # type: ignore[attr-defined]
