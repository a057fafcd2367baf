"""Where the lab's runs execute: this machine (the default) or a Ray cluster.

    executor = executor_for(settings)   # LocalExecutor, or RayExecutor when settings.ray

`crashdrill serve --ray ADDRESS` (or CRASHDRILL_RAY_ADDRESS) connects the server to the
cluster at startup; what cannot work is a SettingsError naming the setting, so `serve`
exits 2 with it: Ray not installed, nothing listening at the address, or a cluster that
refuses the connection. Ray is imported only here and only then: the default lab needs
none of it. How runs live on the cluster is workers/ray_executor.py; docs/cluster.md says
how to point a lab at a real cluster.
"""

from __future__ import annotations

from crashdrill.server.settings import Settings, SettingsError
from crashdrill.workers.executor import Executor, LocalExecutor


def executor_for(settings: Settings) -> Executor:
    """The executor the settings ask for; raises SettingsError naming what is wrong."""
    if settings.ray is None:
        return LocalExecutor()
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
