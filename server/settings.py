"""Server settings: one frozen dataclass with embedded defaults, overridable by env and CLI.

Every setting is documented in docs/server.md (a test checks that).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.workers.supervisor import DEFAULT_COMMAND


def default_data_dir() -> Path:
    """$CRASHDRILL_DATA_DIR, else the user's data directory (XDG) / crashdrill."""
    env = os.environ.get("CRASHDRILL_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "crashdrill"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "crashdrill"


def count_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch or NVML."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        present = 0
    if visible is not None:
        wanted = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        return min(present, len(wanted))
    return present


def default_max_concurrent() -> int:
    """One pair per GPU; on CPU one run per core (presets train with threads = 1), ≥ 2."""
    gpus = count_gpus()
    if gpus:
        return 2 * gpus
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(2, cores)


class SettingsError(ValueError):
    """A setting with a value that cannot work; the message names it."""


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8000
    max_concurrent: int = field(default_factory=default_max_concurrent)
    instructor_token: str | None = None
    secret_key: str | None = None  # None: generated once and kept in data_dir/secret_key
    trainer_command: tuple[str, ...] = DEFAULT_COMMAND
    max_body_bytes: int = 64 * 1024
    max_pairs_per_session: int = 3
    max_queued_runs: int = 200
    ingest_interval_s: float = 0.02
    telemetry: bool = True
    telemetry_interval_s: float = 2.0
    telemetry_keep: int = 5000
    price_per_kwh: float = 0.15
    rent_per_hour: float = 0.0
    stop_runs_on_exit: bool = False
    stream_heartbeat_s: float = 15.0
    stream_max_pending_records: int = 2000

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"port = {self.port}: a number in 1..65535")
        if self.max_concurrent < 1:
            raise SettingsError(f"max_concurrent = {self.max_concurrent}: a whole number ≥ 1")
        if self.max_pairs_per_session < 1 or self.max_queued_runs < 2:
            raise SettingsError("max_pairs_per_session must be ≥ 1 and max_queued_runs ≥ 2")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max_body_bytes = {self.max_body_bytes}: at least 1024")
        if not self.trainer_command:
            raise SettingsError("trainer_command is empty: give the program that trains")
        if self.ingest_interval_s <= 0 or self.telemetry_interval_s <= 0:
            raise SettingsError("ingest_interval_s and telemetry_interval_s must be > 0")

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then CRASHDRILL_* environment variables, then `overrides` (CLI)."""
        values: dict[str, object] = {}
        env = os.environ
        if env.get("CRASHDRILL_INSTRUCTOR_TOKEN"):
            values["instructor_token"] = env["CRASHDRILL_INSTRUCTOR_TOKEN"]
        if env.get("CRASHDRILL_SECRET_KEY"):
            values["secret_key"] = env["CRASHDRILL_SECRET_KEY"]
        if env.get("CRASHDRILL_MAX_CONCURRENT"):
            values["max_concurrent"] = _int("CRASHDRILL_MAX_CONCURRENT")
        if env.get("CRASHDRILL_TRAINER_COMMAND"):
            values["trainer_command"] = tuple(shlex.split(env["CRASHDRILL_TRAINER_COMMAND"]))
        if env.get("CRASHDRILL_TELEMETRY"):
            values["telemetry"] = env["CRASHDRILL_TELEMETRY"].lower() not in ("0", "false", "no")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" in values:
            values["data_dir"] = Path(str(values["data_dir"])).expanduser()
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "crashdrill.sqlite3"

    def resolve_secret_key(self) -> str:
        """The cookie-signing key: the setting, else one kept in data_dir/secret_key."""
        if self.secret_key:
            return self.secret_key
        path = self.data_dir / "secret_key"
        try:
            return path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            pass
        self.data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another server created it a moment ago
            return path.read_text(encoding="utf-8").strip()
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key + "\n")
        return key


def lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on data_dir/server.lock for as long as the returned file
    descriptor stays open: two servers adopting and resuming the same runs would start
    each trainer twice. The kernel drops the lock when the process dies, even by kill -9.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "server.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SettingsError(
            f"another crashdrill server (pid {holder}) uses {data_dir}: stop it, or give"
            " this one another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise SettingsError(f"{name} = {os.environ[name]!r}: a whole number") from None
