"""The storage section of the settings: the database, the checkpoint mirror, and how
long and how much the lab keeps on disk (server/housekeeping.py)."""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.server.setting_schema import (
    GIB,
    NUMBER,
    SECONDS_OFF,
    SIZE,
    TEXT,
    WHOLE_OR_OFF,
    other_variables,
    setting,
)


@dataclass(frozen=True)
class StorageSection:
    """Where records and checkpoints live, how long, and how much (server/housekeeping.py,
    the mirror: docs/server.md "The checkpoint mirror")."""

    TITLE = "Storage"
    OTHER_VARIABLES = other_variables()

    # Never in a repr or a log line: it may hold a password.
    database_url: str | None = setting(
        None,
        default_text="none: SQLite in `data_dir`",
        parse=TEXT,
        env="CRASHDRILL_DATABASE_URL",
        secret=True,
        what="a `postgresql://` or `postgres://` URL: the database is Postgres"
        " ([Database](#database)); no flag, as a password on a command line is visible to"
        " every user of the machine",
    )
    # "" = DATA_DIR-mirror beside the data dir; "off"; a directory; or gs://BUCKET[/PREFIX].
    mirror: str = setting(
        "",
        default_text="`DATA_DIR-mirror` (a directory beside the data dir)",
        parse=TEXT,
        env="CRASHDRILL_MIRROR",
        flag="--mirror",
        help="checkpoint mirror: a directory, gs://BUCKET[/PREFIX], or off (default: a"
        " directory beside the data dir, DATA_DIR-mirror)",
        what="where checkpoints are copied: a directory, `gs://BUCKET[/PREFIX]`"
        " (`.venv/bin/pip install -e '.[gcs]'`), or `off`"
        " ([the checkpoint mirror](#the-checkpoint-mirror))",
    )
    checkpoint_retention_s: float = setting(
        24 * 3600.0,
        default_text="86400 (a day)",
        parse=NUMBER,
        env="CRASHDRILL_CHECKPOINT_RETENTION_S",
        allowed=SECONDS_OFF,
        what="an ended run's checkpoints (here and in the mirror) are deleted this long after"
        " it ended; its records stay; 0: kept ([disk](#disk))",
    )
    disk_budget_bytes: int = setting(
        20 * GIB,
        default_text="20 GiB",
        parse=SIZE,
        env="CRASHDRILL_DISK_BUDGET_BYTES",
        allowed=WHOLE_OR_OFF,
        how_note="(`20G`)",
        what="checkpoints the lab keeps on its disk; past it, ended runs' checkpoints go,"
        " oldest ended first; 0: no budget",
    )
    min_free_disk_bytes: int = setting(
        GIB,
        default_text="1 GiB",
        parse=SIZE,
        env="CRASHDRILL_MIN_FREE_DISK_BYTES",
        allowed=WHOLE_OR_OFF,
        how_note="(`1G`)",
        what="below this much free space where the runs live, new pairs get 503; 0: no floor",
    )
