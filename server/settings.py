"""Server settings: one frozen dataclass with embedded defaults, overridable by env and CLI.

Every setting is documented in docs/server.md (a test checks that).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.server.db import check_postgres_url
from crashdrill.workers.mirror_backends import MirrorURLError, parse_mirror_url
from crashdrill.workers.supervisor import DEFAULT_COMMAND
from crashdrill.workers.trainer_env import env_pass_from_environ

MIN_TOKEN_CHARS = 16  # the instructor token: shorter ones are refused at startup


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
    max_wrong_tokens: int = 10  # per client address per minute; 0: no limit
    secret_key: str | None = None  # None: generated once and kept in data_dir/secret_key
    trainer_command: tuple[str, ...] = DEFAULT_COMMAND
    max_body_bytes: int = 64 * 1024
    max_pairs_per_session: int = 3
    # Live pairs per client address too (0: by cookie alone, for a class behind one NAT).
    max_pairs_per_address: int = 3
    max_queued_runs: int = 200
    idle_stop_s: float = 1800.0  # stop a pair nobody watched for this long; 0: never
    housekeeping_interval_s: float = 10.0  # idle stops and disk cleanup, this often
    # Lesson bounds (server/lesson_bounds.py): settings instructors may open to students
    # beyond the default, and the budget of one run.
    student_unlockable: tuple[str, ...] = ()
    max_params_per_run: int = 50_000_000
    max_tokens_per_run: int = 400_000_000
    max_checkpoint_bytes_per_run: int = 2 * 1024**3
    # Disk: finished runs' checkpoints deleted after this long (0: kept), a budget for
    # all checkpoints (0: none), and the free space below which new pairs get 503.
    checkpoint_retention_s: float = 24 * 3600.0
    disk_budget_bytes: int = 20 * 1024**3
    min_free_disk_bytes: int = 1024**3
    ingest_interval_s: float = 0.02
    telemetry: bool = True
    telemetry_interval_s: float = 2.0
    telemetry_keep: int = 5000
    price_per_kwh: float = 0.15
    rent_per_hour: float = 0.0
    stop_runs_on_exit: bool = False
    stream_heartbeat_s: float = 15.0
    stream_max_pending_records: int = 2000
    # None: SQLite in data_dir. Never in a repr or a log line: it may hold a password.
    database_url: str | None = field(default=None, repr=False)
    # Supabase Realtime (docs/server.md "Supabase Realtime"): on when the URL and anon key are set.
    supabase_url: str | None = None
    supabase_anon_key: str | None = None  # public: the page subscribes with it
    supabase_service_key: str | None = field(default=None, repr=False)  # server only, never sent
    supabase_tick_s: float = 1.0
    supabase_max_payload_bytes: int = 128 * 1024
    supabase_max_messages_per_s: float = 20.0
    presets_dir: Path | None = None  # None: data_dir/presets (instructor presets, TOML files)
    # Checkpoint mirror: "" = the directory DATA_DIR-mirror beside the data dir; "off";
    # a local directory; or gs://BUCKET[/PREFIX] (needs crashdrill[gcs]).
    mirror: str = ""
    # Ray cluster for the runs (docs/cluster.md): None = subprocesses on this machine;
    # "auto", HOST:PORT or ray://HOST:PORT (needs crashdrill[ray] and an explicit mirror).
    ray: str | None = None
    # ---- trainers, sessions, browsers, streams (docs/server.md "Running a lab for a class")
    corpora_dir: Path | None = None  # None: data_dir/corpora; `file:` corpora only from there
    # Names or PREFIX* a trainer inherits beyond the allowlist (workers/trainer_env.py).
    trainer_env_pass: tuple[str, ...] = field(default_factory=env_pass_from_environ)
    instructor_session_s: float = 12 * 3600.0  # an instructor login lasts this long
    https: bool = False  # served over https (cookies get Secure)
    trusted_proxies: tuple[str, ...] = ()  # proxy addresses whose X-Forwarded-* are believed
    allowed_origins: tuple[str, ...] = ()  # other origins that may send state changes
    stream_max_per_address: int = 64  # open event streams per client address
    stream_max_total: int = 1000  # open event streams in all

    def __post_init__(self) -> None:
        self._check_hardening()
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"port = {self.port}: a number in 1..65535")
        if self.max_concurrent < 1:
            raise SettingsError(f"max_concurrent = {self.max_concurrent}: a whole number ≥ 1")
        if self.max_pairs_per_session < 1 or self.max_queued_runs < 2:
            raise SettingsError("max_pairs_per_session must be ≥ 1 and max_queued_runs ≥ 2")
        self._check_class_limits()
        if self.max_wrong_tokens < 0:
            raise SettingsError(
                f"max_wrong_tokens = {self.max_wrong_tokens}: a whole number ≥ 0 (0: no limit)"
            )
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max_body_bytes = {self.max_body_bytes}: at least 1024")
        if not self.trainer_command:
            raise SettingsError("trainer_command is empty: give the program that trains")
        if self.ingest_interval_s <= 0 or self.telemetry_interval_s <= 0:
            raise SettingsError("ingest_interval_s and telemetry_interval_s must be > 0")
        if self.database_url is not None:
            try:
                check_postgres_url(self.database_url, "CRASHDRILL_DATABASE_URL")
            except ValueError as e:
                raise SettingsError(str(e)) from None
        self._check_supabase()
        if self.mirror not in ("", "off"):
            try:
                parse_mirror_url(self.mirror)
            except MirrorURLError as e:
                raise SettingsError(f"{e}, or off") from None
        self._check_ray()

    def _check_class_limits(self) -> None:
        """The settings of "Running a lab for a class" (docs/server.md)."""
        from crashdrill.server.lesson_bounds import SERVER_LOCKED

        unknown = sorted(set(self.student_unlockable) - SERVER_LOCKED)
        if unknown:
            raise SettingsError(
                f"student_unlockable: {', '.join(unknown)} is not locked by the server;"
                f" allowed: {', '.join(sorted(SERVER_LOCKED))}"
            )
        for name in ("max_pairs_per_address", "disk_budget_bytes", "min_free_disk_bytes"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} = {getattr(self, name)}: a whole number ≥ 0")
        for name in ("max_params_per_run", "max_tokens_per_run", "max_checkpoint_bytes_per_run"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} = {getattr(self, name)}: a whole number ≥ 1")
        for name in ("idle_stop_s", "checkpoint_retention_s"):
            if not getattr(self, name) >= 0:
                raise SettingsError(f"{name} = {getattr(self, name)}: seconds ≥ 0 (0: off)")
        if not self.housekeeping_interval_s > 0:
            raise SettingsError(
                f"housekeeping_interval_s = {self.housekeeping_interval_s}: seconds > 0"
            )

    def _check_ray(self) -> None:
        if self.ray is None:
            return
        if not self.ray.strip():
            raise SettingsError("ray = '': auto, HOST:PORT or ray://HOST:PORT (or unset it)")
        if self.mirror in ("", "off"):
            raise SettingsError(
                f"ray = {self.ray!r} needs a checkpoint mirror that every node reaches (a node"
                " and its disk can vanish): set mirror (--mirror, CRASHDRILL_MIRROR) to"
                " gs://BUCKET[/PREFIX], or to a directory all nodes share"
            )

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then CRASHDRILL_* environment variables, then `overrides` (CLI)."""
        values: dict[str, object] = {}
        env = os.environ
        if env.get("CRASHDRILL_INSTRUCTOR_TOKEN"):
            values["instructor_token"] = env["CRASHDRILL_INSTRUCTOR_TOKEN"]
        if env.get("CRASHDRILL_MAX_WRONG_TOKENS"):
            values["max_wrong_tokens"] = _int("CRASHDRILL_MAX_WRONG_TOKENS")
        if env.get("CRASHDRILL_SECRET_KEY"):
            values["secret_key"] = env["CRASHDRILL_SECRET_KEY"]
        if env.get("CRASHDRILL_MAX_CONCURRENT"):
            values["max_concurrent"] = _int("CRASHDRILL_MAX_CONCURRENT")
        if env.get("CRASHDRILL_TRAINER_COMMAND"):
            values["trainer_command"] = tuple(shlex.split(env["CRASHDRILL_TRAINER_COMMAND"]))
        if env.get("CRASHDRILL_INSTRUCTOR_PRESETS_DIR"):
            values["presets_dir"] = Path(env["CRASHDRILL_INSTRUCTOR_PRESETS_DIR"]).expanduser()
        values.update(_supabase_env())
        values.update(_class_env())
        if env.get("CRASHDRILL_TELEMETRY"):
            values["telemetry"] = env["CRASHDRILL_TELEMETRY"].lower() not in ("0", "false", "no")
        if env.get("CRASHDRILL_MIRROR", "").strip():
            values["mirror"] = env["CRASHDRILL_MIRROR"].strip()
        if env.get("CRASHDRILL_RAY_ADDRESS", "").strip():
            values["ray"] = env["CRASHDRILL_RAY_ADDRESS"].strip()
        if env.get("CRASHDRILL_DATABASE_URL", "").strip():
            values["database_url"] = env["CRASHDRILL_DATABASE_URL"].strip()
        values.update(_hardening_env())
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" in values:
            values["data_dir"] = Path(str(values["data_dir"])).expanduser()
        return cls(**values)  # type: ignore[arg-type]

    def _check_hardening(self) -> None:
        if self.instructor_token and len(self.instructor_token) < MIN_TOKEN_CHARS:
            raise SettingsError(
                f"CRASHDRILL_INSTRUCTOR_TOKEN is {len(self.instructor_token)} characters: at"
                f" least {MIN_TOKEN_CHARS} (make one with: python3 -c 'import secrets;"
                " print(secrets.token_urlsafe(24))')"
            )
        if not 60 <= self.instructor_session_s <= 30 * 24 * 3600:
            raise SettingsError(
                f"instructor_session_s = {self.instructor_session_s}: 60 to 2592000 seconds"
            )
        if self.stream_max_per_address < 1 or self.stream_max_total < 1:
            raise SettingsError(
                "stream_max_per_address and stream_max_total must be whole numbers ≥ 1"
            )
        for origin in self.allowed_origins:
            if not re.fullmatch(r"https?://[^/\s?#]+", origin):
                raise SettingsError(
                    f"CRASHDRILL_ALLOWED_ORIGINS: {origin!r} is not an origin; give"
                    " scheme://host[:port], like https://lab.example.org"
                )

    def _check_supabase(self) -> None:
        if self.supabase_url is None and self.supabase_service_key is None:
            return
        url = self.supabase_url or ""
        if not url.startswith(("https://", "http://")) or "?" in url:
            raise SettingsError(
                f"SUPABASE_URL = {url!r}: the project URL, like https://PROJECT.supabase.co"
            )
        if not self.supabase_anon_key:
            raise SettingsError(
                "SUPABASE_URL is set but SUPABASE_ANON_KEY is not: the page subscribes to"
                " Realtime with the project's anon (publishable) key"
            )
        if self.supabase_service_key and self.supabase_service_key == self.supabase_anon_key:
            raise SettingsError("SUPABASE_SERVICE_KEY is the anon key: give the service_role key")
        if not 0.1 <= self.supabase_tick_s <= 60:
            raise SettingsError(f"supabase_tick_s = {self.supabase_tick_s}: 0.1 to 60 seconds")
        if not 4096 <= self.supabase_max_payload_bytes <= 3_000_000:
            raise SettingsError(
                f"supabase_max_payload_bytes = {self.supabase_max_payload_bytes}: 4096 to"
                " 3000000 (Supabase allows 256 KB on the Free plan, 3,000 KB on paid plans)"
            )
        if not 0 < self.supabase_max_messages_per_s <= 2500:
            raise SettingsError(
                f"supabase_max_messages_per_s = {self.supabase_max_messages_per_s}: > 0 and"
                " at most 2500 (Supabase allows 100 a second on the Free plan)"
            )

    @property
    def realtime(self) -> bool:
        """Supabase Realtime is on (else the page uses only the server's SSE stream)."""
        return bool(self.supabase_url and self.supabase_anon_key)

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def instructor_presets_dir(self) -> Path:
        """Where instructor presets live: the `presets_dir` setting, else data_dir/presets."""
        return self.presets_dir if self.presets_dir is not None else self.data_dir / "presets"

    @property
    def mirror_url(self) -> str | None:
        """Where checkpoints are mirrored: the setting, else DATA_DIR-mirror; None when off."""
        if self.mirror == "off":
            return None
        if self.mirror:
            return str(parse_mirror_url(self.mirror))
        return str(self.data_dir.with_name(self.data_dir.name + "-mirror"))

    @property
    def corpora(self) -> Path:
        """Where `file:` corpora may be read from: the setting, else data_dir/corpora."""
        return self.corpora_dir if self.corpora_dir is not None else self.data_dir / "corpora"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "crashdrill.sqlite3"

    def resolve_secret_key(self) -> str:
        """The cookie-signing key: the setting, else one kept in data_dir/secret_key."""
        if self.secret_key:
            return self.secret_key
        return _kept_token(self.data_dir / "secret_key", 32)

    def resolve_lab_id(self) -> str:
        """This lab's id, kept in data_dir/lab_id: the runs it starts carry it, so labs
        sharing one database leave each other's runs alone."""
        return _kept_token(self.data_dir / "lab_id", 12)


def _kept_token(path: Path, nbytes: int) -> str:
    """A random token made once and kept in `path` (mode 0600); the first writer wins."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(nbytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another server created it a moment ago, or it is empty
        for _ in range(50):
            text = path.read_text(encoding="utf-8").strip()
            if text:
                return text
            time.sleep(0.02)
        raise SettingsError(f"{path} is empty: delete it and start the server again") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token


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


def _supabase_env() -> dict[str, object]:
    """SUPABASE_URL, SUPABASE_ANON_KEY, SUPABASE_SERVICE_KEY (the names Supabase's own
    examples use) and the CRASHDRILL_SUPABASE_* limits."""
    env = os.environ
    values: dict[str, object] = {}
    for name in ("SUPABASE_URL", "SUPABASE_ANON_KEY", "SUPABASE_SERVICE_KEY"):
        if env.get(name):
            values[name.lower()] = env[name].strip()
    if env.get("CRASHDRILL_SUPABASE_TICK_S"):
        values["supabase_tick_s"] = _float("CRASHDRILL_SUPABASE_TICK_S")
    if env.get("CRASHDRILL_SUPABASE_MAX_PAYLOAD_BYTES"):
        values["supabase_max_payload_bytes"] = _int("CRASHDRILL_SUPABASE_MAX_PAYLOAD_BYTES")
    if env.get("CRASHDRILL_SUPABASE_MAX_MESSAGES_PER_S"):
        values["supabase_max_messages_per_s"] = _float("CRASHDRILL_SUPABASE_MAX_MESSAGES_PER_S")
    return values


def _hardening_env() -> dict[str, object]:
    """The settings of docs/server.md "Running a lab for a class" from the environment
    (CRASHDRILL_TRAINER_ENV_PASS is read by its default)."""
    env = os.environ
    values: dict[str, object] = {}
    if env.get("CRASHDRILL_CORPORA_DIR", "").strip():
        values["corpora_dir"] = Path(env["CRASHDRILL_CORPORA_DIR"].strip()).expanduser()
    if env.get("CRASHDRILL_INSTRUCTOR_SESSION_S"):
        values["instructor_session_s"] = _float("CRASHDRILL_INSTRUCTOR_SESSION_S")
    if env.get("CRASHDRILL_HTTPS"):
        values["https"] = env["CRASHDRILL_HTTPS"].strip().lower() in ("1", "true", "yes", "on")
    for name in ("CRASHDRILL_TRUSTED_PROXIES", "CRASHDRILL_ALLOWED_ORIGINS"):
        if env.get(name, "").strip():
            values[name[11:].lower()] = tuple(re.split(r"[\s,]+", env[name].strip()))
    if env.get("CRASHDRILL_STREAM_MAX_PER_ADDRESS"):
        values["stream_max_per_address"] = _int("CRASHDRILL_STREAM_MAX_PER_ADDRESS")
    if env.get("CRASHDRILL_STREAM_MAX_TOTAL"):
        values["stream_max_total"] = _int("CRASHDRILL_STREAM_MAX_TOTAL")
    return values


def _class_env() -> dict[str, object]:
    """The CRASHDRILL_* variables of a lab for a class (docs/server.md)."""
    env = os.environ
    values: dict[str, object] = {}
    for variable, (name, parse) in {
        "CRASHDRILL_MAX_PAIRS_PER_SESSION": ("max_pairs_per_session", _int),
        "CRASHDRILL_MAX_PAIRS_PER_ADDRESS": ("max_pairs_per_address", _int),
        "CRASHDRILL_MAX_QUEUED_RUNS": ("max_queued_runs", _int),
        "CRASHDRILL_IDLE_STOP_S": ("idle_stop_s", _float),
        "CRASHDRILL_MAX_PARAMS_PER_RUN": ("max_params_per_run", _bytes),
        "CRASHDRILL_MAX_TOKENS_PER_RUN": ("max_tokens_per_run", _bytes),
        "CRASHDRILL_MAX_CHECKPOINT_BYTES_PER_RUN": ("max_checkpoint_bytes_per_run", _bytes),
        "CRASHDRILL_CHECKPOINT_RETENTION_S": ("checkpoint_retention_s", _float),
        "CRASHDRILL_DISK_BUDGET_BYTES": ("disk_budget_bytes", _bytes),
        "CRASHDRILL_MIN_FREE_DISK_BYTES": ("min_free_disk_bytes", _bytes),
    }.items():
        if env.get(variable, "").strip():
            values[name] = parse(variable)
    if env.get("CRASHDRILL_STUDENT_UNLOCKABLE", "").strip():
        raw = env["CRASHDRILL_STUDENT_UNLOCKABLE"].replace(",", " ").split()
        values["student_unlockable"] = tuple(raw)
    return values


_SUFFIXES = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _bytes(name: str) -> int:
    """A whole number, optionally with a binary suffix: 500M, 20G (also 20GiB)."""
    raw = os.environ[name].strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(raw[-1:], 1)
    try:
        return int(float(raw[:-1] if scale > 1 else raw) * scale)
    except ValueError:
        raise SettingsError(
            f"{name} = {os.environ[name]!r}: a whole number, optionally with K, M, G or T"
        ) from None


def _float(name: str) -> float:
    try:
        return float(os.environ[name])
    except ValueError:
        raise SettingsError(f"{name} = {os.environ[name]!r}: a number") from None


def _int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise SettingsError(f"{name} = {os.environ[name]!r}: a whole number") from None
