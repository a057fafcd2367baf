"""The cluster section of the settings: where trainers run, the executor by name and each
executor's options (workers/executor_registry.py; docs/cluster.md). A new executor's
options are fields here, and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.server.setting_schema import (
    TEXT,
    other_variables,
    setting,
)


@dataclass(frozen=True)
class ClusterSection:
    """Where trainers run (workers/executor_registry.py; docs/cluster.md): the executor by
    name and each executor's options. A new executor's options are fields here."""

    TITLE = "Where trainers run"
    OTHER_VARIABLES = other_variables()

    # "": ray when ray_address is set, else local (Settings makes it a name).
    executor: str = setting(
        "",
        default_text="`local` (subprocesses on this machine); `ray` when `ray_address` is set",
        parse=TEXT,
        env="CRASHDRILL_EXECUTOR",
        flag="--executor",
        metavar="NAME",
        what="where trainers run, by name (`workers/executor_registry.py`): `local` or `ray`;"
        " another name exits 2 naming the allowed ones ([cluster.md](cluster.md))",
    )
    # Needs crashdrill[ray] and an explicit mirror every node reaches.
    ray_address: str | None = setting(
        None,
        default_text="none",
        parse=TEXT,
        env="CRASHDRILL_RAY_ADDRESS",
        flag="--ray-address",
        metavar="ADDRESS",
        how_note="; `--ray ADDRESS` is short for `--executor ray --ray-address ADDRESS`",
        help="the Ray executor's cluster: auto, HOST:PORT or ray://HOST:PORT (needs"
        " crashdrill[ray] and --mirror; CRASHDRILL_RAY_ADDRESS)",
        what="the `ray` executor's cluster: `auto`, `HOST:PORT` or `ray://HOST:PORT`"
        " (`.venv/bin/pip install -e '.[ray]'`); needs `mirror` set to a place every node"
        " reaches; an unreachable address, a missing mirror, or an address with `--executor"
        " local` exits 2 naming it ([cluster.md](cluster.md))",
    )
