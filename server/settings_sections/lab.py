"""The lab section of the settings: where this lab listens and keeps its data, how it
starts its trainers, its instructor and its machine sampler (docs/server.md "Settings")."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from crashdrill.server.setting_schema import (
    COMMAND,
    NAMES,
    NUMBER,
    PATH,
    SECRET,
    SWITCH,
    TEXT,
    WHOLE,
    WHOLE_OR_OFF,
    Allowed,
    above,
    at_least,
    between,
    other_variables,
    setting,
)
from crashdrill.workers.launch import DEFAULT_COMMAND
from crashdrill.workers.trainer_env import ENV_PASS_VARIABLE, env_pass_from_environ

DATA_DIR_VARIABLE = "CRASHDRILL_DATA_DIR"


def default_data_dir() -> Path:
    """$CRASHDRILL_DATA_DIR, else the user's data directory (XDG) / crashdrill."""
    env = os.environ.get(DATA_DIR_VARIABLE)
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "crashdrill"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "crashdrill"


@dataclass(frozen=True)
class LabSection:
    """This machine's lab: where it listens and keeps its data, its trainers, its sampler."""

    TITLE = "The lab"
    # Variables other modules read, listed in the table all the same: (name, default, how, what).
    OTHER_VARIABLES = other_variables(
        (
            "(warm trainers)",
            "on",
            "`CRASHDRILL_WARM_TRAINERS=0` turns them off",
            "the built-in trainer forks from a warm process that imported torch once"
            " ([warm trainers](#warm-trainers))",
        ),
    )

    data_dir: Path = setting(
        factory=default_data_dir,
        default_text="`$XDG_DATA_HOME/crashdrill` (`~/.local/share/crashdrill`)",
        parse=PATH,
        env=DATA_DIR_VARIABLE,
        env_read_by_default=True,
        flag="--data-dir",
        help="database, run dirs and keys (default: user data dir)",
        what="database `crashdrill.sqlite3`, `runs/`, `secret_key`",
    )
    host: str = setting(
        "127.0.0.1",
        default_text="`127.0.0.1`",
        parse=TEXT,
        flag="--host",
        help="address to listen on (default 127.0.0.1)",
        what="address to listen on",
    )
    port: int = setting(
        8000,
        default_text="`8000`",
        parse=WHOLE,
        flag="--port",
        allowed=between(1, 65535, "a number in 1..65535"),
        help="port to listen on (default 8000)",
        what="port to listen on",
    )
    # None: from this machine (settings.default_max_concurrent); on an executor that queues
    # itself (ray) it stays None: every run waits for a node with its resources.
    max_concurrent: int | None = setting(
        None,
        default_text="2 per GPU; else two per core, at least 4 (one per core always, more"
        " while runs keep their pace: [admission](#admission)); with `ray`, none (the"
        " cluster's nodes decide)",
        parse=WHOLE,
        env="CRASHDRILL_MAX_CONCURRENT",
        flag="--max-concurrent",
        allowed=at_least(1),
        help="runs that train at once, at most (default: what the machine carries, from"
        " cores/GPUs and the runs' measured pace; on a Ray cluster, the cluster's nodes"
        " decide); above the machine's ceiling it is clamped, unless --allow-overcommit",
        what="runs training at once, at most; the rest queue; above the default it is"
        " clamped to it, with a warning",
    )
    allow_overcommit: bool = setting(
        False,
        default_text="false",
        parse=SWITCH,
        env="CRASHDRILL_ALLOW_OVERCOMMIT",
        flag="--allow-overcommit",
        how_note="(1/true/yes/on, 0/false/no/off)",
        help="keep a --max-concurrent above what this machine carries (default: clamped)",
        what="keep a `max_concurrent` above what the machine carries: that many runs at once,"
        " measured or not ([admission](#admission))",
    )
    instructor_token: str | None = setting(
        None,
        default_text="none (no instructor)",
        parse=SECRET,
        env="CRASHDRILL_INSTRUCTOR_TOKEN",
        what="lets its bearer crash or stop anyone's runs",
    )
    max_wrong_tokens: int = setting(
        10,
        parse=WHOLE,
        env="CRASHDRILL_MAX_WRONG_TOKENS",
        allowed=WHOLE_OR_OFF,
        what="wrong instructor tokens (login or header) one client address may offer per"
        " minute; past it every token from that address gets 429 with `Retry-After` until"
        " the oldest is a minute old; 0 turns the limit off. Counted by the client's address"
        " (behind a reverse proxy, the proxy's unless it is in `trusted_proxies`)",
    )
    instructor_session_s: float = setting(
        12 * 3600.0,
        default_text="43200 (12 h)",
        parse=NUMBER,
        env="CRASHDRILL_INSTRUCTOR_SESSION_S",
        allowed=between(60, 30 * 24 * 3600, "60 to 2592000 seconds"),
        what="how long an instructor login lasts (60 s to 30 days)",
    )
    secret_key: str | None = setting(
        None,
        default_text="generated once into `DATA/secret_key`",
        parse=SECRET,
        env="CRASHDRILL_SECRET_KEY",
        what="signs the session cookies",
    )
    trainer_command: tuple[str, ...] = setting(
        DEFAULT_COMMAND,
        default_text="`python -m crashdrill run`",
        parse=COMMAND,
        env="CRASHDRILL_TRAINER_COMMAND",
        allowed=Allowed("a command: give the program that trains", bool),
        what="program a run starts (fast tests use the test double"
        " `tests/support/stand_in_trainer.py`)",
    )
    trainer_nice: int = setting(
        10,
        parse=WHOLE,
        env="CRASHDRILL_TRAINER_NICE",
        allowed=between(0, 19, "a nice value in 0..19 (0: trainers keep the server's priority)"),
        what="nice value (0–19) every trainer runs at, with `SCHED_BATCH`, from its first"
        " instruction (set right after the fork or before the exec): the server, its"
        " streams and pages keep the CPU first when a class shares the machine; 0 keeps"
        " trainers at the server's priority ([warm trainers](#warm-trainers))",
    )
    trainer_env_pass: tuple[str, ...] = setting(
        factory=env_pass_from_environ,
        default_text="none",
        parse=NAMES,
        env=ENV_PASS_VARIABLE,
        env_read_by_default=True,
        what="variables a trainer inherits beyond the allowlist: `NAME` or `PREFIX*`,"
        " separated by commas or spaces (never a server secret)",
    )
    corpora_dir: Path | None = setting(
        None,
        default_text="`DATA/corpora`",
        parse=PATH,
        env="CRASHDRILL_CORPORA_DIR",
        what='the only place a preset\'s `data = "file:PATH"` may read (PATH relative to it,'
        " or absolute inside it; no symlink out, no `/proc`, no `/dev`)",
    )
    presets_dir: Path | None = setting(
        None,
        default_text="`DATA/presets`",
        parse=PATH,
        env="CRASHDRILL_INSTRUCTOR_PRESETS_DIR",
        what="instructor presets, one `ID.toml` each (built-ins and `CRASHDRILL_PRESETS_DIR`"
        " stay read-only)",
    )
    ingest_interval_s: float = setting(
        0.02,
        allowed=above(0, "seconds > 0"),
        what="how often live records files are checked",
    )
    housekeeping_interval_s: float = setting(
        10.0,
        default_text="10",
        allowed=above(0, "seconds > 0"),
        what="how often idle pairs are looked for and old checkpoints cleaned up",
    )
    telemetry: bool = setting(
        True,
        default_text="on",
        parse=SWITCH,
        env="CRASHDRILL_TELEMETRY",
        how_note="(0 turns it off)",
        what="the machine sampler",
    )
    telemetry_interval_s: float = setting(
        2.0,
        allowed=above(0, "seconds > 0"),
        what="seconds between machine samples",
    )
    telemetry_keep: int = setting(5000, what="samples kept in the database")
    price_per_kwh: float = setting(0.15, what="for the sampler's energy cost")
    rent_per_hour: float = setting(0.0, what="for the sampler's rent cost")
    stop_runs_on_exit: bool = setting(
        False,
        default_text="off",
        parse=SWITCH,
        flag="--stop-runs-on-exit",
        help="stop the runs when the server exits (default: they keep training and the"
        " next start adopts them)",
        what="stop trainers on a graceful exit instead of leaving them to be adopted",
    )
