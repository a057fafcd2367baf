"""Server settings: one frozen dataclass with embedded defaults, overridable by env and CLI.

Every setting is documented in docs/server.md (a test checks that).
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.server.db import check_postgres_url
from crashdrill.server.settings_env import (
    SettingsError,
    allowed_hosts_from_environ,
    values_from_env,
)
from crashdrill.workers.executor_registry import ExecutorConfigError, executor_kind
from crashdrill.workers.launch import DEFAULT_COMMAND
from crashdrill.workers.mirror_backends import MirrorURLError, parse_mirror_url
from crashdrill.workers.trainer_env import env_pass_from_environ

# The instructor token (docs/presets.md#instructor-mode): surrounding whitespace is
# stripped; the rest must be this long, printable, and hold this many bits by
# token_bits (a floor against mistakes: a blank, repeated or short token).
MIN_TOKEN_CHARS = 16
MIN_TOKEN_BITS = 64
TOKEN_ADVICE = "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"


def token_bits(token: str) -> float:
    """What the token would hold if each character were drawn at random from the characters
    it uses: length × log2(distinct characters). 16 spaces: 0; secrets.token_urlsafe(24)
    (32 characters, about 25 distinct): about 150."""
    distinct = len(set(token))
    return len(token) * math.log2(distinct) if distinct > 1 else 0.0


def token_problem(token: str) -> str | None:
    """Why an (already stripped) instructor token is too weak to guard the lab; None if not."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"is {len(token)} characters after stripping spaces: at least {MIN_TOKEN_CHARS}"
    if not token.isprintable():
        return "holds a control character: printable characters only"
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        return (
            f"is too predictable: {len(token)} characters of {len(set(token))} distinct hold"
            f" {bits:.0f} bits (length × log2(distinct characters)); at least {MIN_TOKEN_BITS}"
        )
    return None


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


def default_disk_bytes_per_run(gpus: int | None = None) -> int:
    """What one run may write over its life: 4 GiB on a CPU machine (lesson-1.13, the
    largest, writes 0.7 GB as shipped and 2.6 GB with a student's longest run), 32 GiB
    where a GPU is (lesson-1.7's CUDA checkpoints: 8.1 GB as shipped, 31.5 GB longest)."""
    gpus = count_gpus() if gpus is None else gpus
    return (32 if gpus else 4) * 1024**3


def default_max_concurrent() -> int:
    """What this machine carries (server/admission.py): one pair per GPU; on CPU one run
    per core (presets train with threads = 1, at least 2), up to two per core while the
    runs keep their pace."""
    from crashdrill.server.admission import machine_ceiling

    return machine_ceiling(count_gpus())


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8000
    # Runs training at once, at most (server/admission.py: what the machine carries is
    # measured below it). None: from this machine (default_max_concurrent); on an
    # executor that queues itself (ray) it stays None: every run waits for a node with
    # its resources (the cluster's queue). Above this machine's ceiling it is clamped
    # unless allow_overcommit.
    max_concurrent: int | None = None
    allow_overcommit: bool = False
    instructor_token: str | None = None
    max_wrong_tokens: int = 10  # per client address per minute; 0: no limit
    secret_key: str | None = None  # None: generated once and kept in data_dir/secret_key
    trainer_command: tuple[str, ...] = DEFAULT_COMMAND
    # Every trainer runs at this nice value (and SCHED_BATCH) from its first instruction
    # (trainer/priority.py): the server keeps the CPU first when a class shares a machine.
    # 0: trainers keep the server's priority.
    trainer_nice: int = 10
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
    # Bytes a run writes over its life (one checkpoint × the checkpoints it saves, mirror
    # copies counted), and a client address's live pairs together (0: no limit). None:
    # from this machine (default_disk_bytes_per_run; per address 3 × per run).
    max_disk_bytes_per_run: int | None = None
    max_disk_bytes_per_address: int | None = None
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
    # Where trainers run, by name (workers/executor_registry.py; docs/cluster.md): "local"
    # (subprocesses on this machine) or "ray"; "": ray when ray_address is set, else local.
    executor: str = ""
    # The Ray executor's cluster: "auto", HOST:PORT or ray://HOST:PORT (needs
    # crashdrill[ray] and an explicit mirror every node reaches).
    ray_address: str | None = None
    # ---- trainers, sessions, browsers, streams (docs/server.md "Running a lab for a class")
    corpora_dir: Path | None = None  # None: data_dir/corpora; `file:` corpora only from there
    # Names or PREFIX* a trainer inherits beyond the allowlist (workers/trainer_env.py).
    trainer_env_pass: tuple[str, ...] = field(default_factory=env_pass_from_environ)
    instructor_session_s: float = 12 * 3600.0  # an instructor login lasts this long
    https: bool = False  # served over https (cookies get Secure)
    trusted_proxies: tuple[str, ...] = ()  # proxy addresses whose X-Forwarded-* are believed
    allowed_origins: tuple[str, ...] = ()  # other origins that may send state changes
    # Host names the lab answers to beyond loopback names, IP addresses and `host`
    # (server/allowed_hosts.py: DNS rebinding); "*" turns the check off.
    allowed_hosts: tuple[str, ...] = field(default_factory=allowed_hosts_from_environ)
    stream_max_per_address: int = 64  # open event streams per client address
    stream_max_total: int = 1000  # open event streams in all
    # ---- connections (docs/server.md "The front door"; server/front_door.py)
    max_connections: int = 2000  # open at once, all addresses; lowered to fit open files
    max_connections_per_address: int = 256  # a class of 60 behind one NAT uses ~120-200
    request_read_timeout_s: float = 10.0  # a request's line, headers and body, from its start
    # An idle connection after a response: longer than the clients' own idle expiry
    # (httpx 5 s, aiohttp 15 s), so that the client, never the server, closes an idle one:
    # a server that closes it as the client reuses it drops that request unanswered.
    keep_alive_timeout_s: float = 75.0
    listen_backlog: int = 256  # connections the kernel queues before the lab accepts them

    def __post_init__(self) -> None:
        self._check_hardening()
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"port = {self.port}: a number in 1..65535")
        self._check_executor()
        if self.max_concurrent is None and not self.on_cluster:
            object.__setattr__(self, "max_concurrent", default_max_concurrent())
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise SettingsError(f"max_concurrent = {self.max_concurrent}: a whole number ≥ 1")
        if self.max_disk_bytes_per_run is None:
            object.__setattr__(self, "max_disk_bytes_per_run", default_disk_bytes_per_run())
        if self.max_disk_bytes_per_address is None:
            per_run = self.max_disk_bytes_per_run or 0
            object.__setattr__(self, "max_disk_bytes_per_address", 3 * per_run)
        if self.max_pairs_per_session < 1 or self.max_queued_runs < 2:
            raise SettingsError("max_pairs_per_session must be ≥ 1 and max_queued_runs ≥ 2")
        self._check_class_limits()
        self._check_connections()
        if self.max_wrong_tokens < 0:
            raise SettingsError(
                f"max_wrong_tokens = {self.max_wrong_tokens}: a whole number ≥ 0 (0: no limit)"
            )
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max_body_bytes = {self.max_body_bytes}: at least 1024")
        if not self.trainer_command:
            raise SettingsError("trainer_command is empty: give the program that trains")
        if not 0 <= self.trainer_nice <= 19:
            raise SettingsError(
                f"trainer_nice = {self.trainer_nice}: a nice value in 0..19 (0: trainers keep"
                " the server's priority)"
            )
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

    def _check_class_limits(self) -> None:
        """The settings of "Running a lab for a class" (docs/server.md)."""
        from crashdrill.server.lesson_bounds import SERVER_LOCKED

        unknown = sorted(set(self.student_unlockable) - SERVER_LOCKED)
        if unknown:
            raise SettingsError(
                f"student_unlockable: {', '.join(unknown)} is not locked by the server;"
                f" allowed: {', '.join(sorted(SERVER_LOCKED))}"
            )
        for name in (
            "max_pairs_per_address",
            "disk_budget_bytes",
            "min_free_disk_bytes",
            "max_disk_bytes_per_address",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} = {getattr(self, name)}: a whole number ≥ 0")
        for name in (
            "max_params_per_run",
            "max_tokens_per_run",
            "max_checkpoint_bytes_per_run",
            "max_disk_bytes_per_run",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} = {getattr(self, name)}: a whole number ≥ 1")
        for name in ("idle_stop_s", "checkpoint_retention_s"):
            if not getattr(self, name) >= 0:
                raise SettingsError(f"{name} = {getattr(self, name)}: seconds ≥ 0 (0: off)")
        if not self.housekeeping_interval_s > 0:
            raise SettingsError(
                f"housekeeping_interval_s = {self.housekeeping_interval_s}: seconds > 0"
            )

    def _check_connections(self) -> None:
        """The front door's caps (server/front_door.py)."""
        if not 16 <= self.max_connections <= 1_000_000:
            raise SettingsError(f"max_connections = {self.max_connections}: 16 to 1000000")
        if not 1 <= self.max_connections_per_address <= self.max_connections:
            raise SettingsError(
                f"max_connections_per_address = {self.max_connections_per_address}: 1 to"
                f" max_connections ({self.max_connections})"
            )
        for name in ("request_read_timeout_s", "keep_alive_timeout_s"):
            if not 0.5 <= getattr(self, name) <= 300:
                raise SettingsError(f"{name} = {getattr(self, name)}: 0.5 to 300 seconds")
        if not 16 <= self.listen_backlog <= 65535:
            raise SettingsError(f"listen_backlog = {self.listen_backlog}: 16 to 65535")

    def _check_executor(self) -> None:
        """The executor's name and its options (docs/cluster.md); "" becomes a name."""
        if not self.executor:
            object.__setattr__(self, "executor", "ray" if self.ray_address is not None else "local")
        try:
            kind = executor_kind(self.executor)
        except ExecutorConfigError as e:
            raise SettingsError(f"{e} (--executor, CRASHDRILL_EXECUTOR)") from None
        if self.ray_address is not None:
            if kind.name != "ray":
                raise SettingsError(
                    f"ray_address = {self.ray_address!r} is for executor 'ray', not"
                    f" {kind.name!r}: unset it (CRASHDRILL_RAY_ADDRESS) or use --executor ray"
                )
            if not self.ray_address.strip():
                raise SettingsError(
                    "ray_address = '': auto, HOST:PORT or ray://HOST:PORT (or unset it)"
                )
        elif kind.name == "ray":
            raise SettingsError(
                "executor = 'ray' needs ray_address (--ray-address, CRASHDRILL_RAY_ADDRESS):"
                " auto, HOST:PORT or ray://HOST:PORT"
            )
        if kind.cluster and self.mirror in ("", "off"):
            raise SettingsError(
                f"executor = {kind.name!r} (ray_address = {self.ray_address!r}) needs a"
                " checkpoint mirror that every node reaches (a node and its disk can vanish):"
                " set mirror (--mirror, CRASHDRILL_MIRROR) to gs://BUCKET[/PREFIX], or to a"
                " directory all nodes share"
            )

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then CRASHDRILL_* environment variables, then `overrides` (CLI)."""
        values = values_from_env()
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" in values:
            values["data_dir"] = Path(str(values["data_dir"])).expanduser()
        return cls(**values)  # type: ignore[arg-type]

    def _check_hardening(self) -> None:
        if self.instructor_token:  # "": instructor mode off, as when unset
            token = self.instructor_token.strip()
            object.__setattr__(self, "instructor_token", token or None)
            problem = token_problem(token)
            if problem:
                raise SettingsError(f"CRASHDRILL_INSTRUCTOR_TOKEN {problem} ({TOKEN_ADVICE})")
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
        from crashdrill.server.allowed_hosts import host_name_problem

        for name in self.allowed_hosts:
            problem = host_name_problem(name)
            if problem:
                raise SettingsError(f"CRASHDRILL_ALLOWED_HOSTS: {name!r} {problem}")

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
    def on_cluster(self) -> bool:
        """Runs train on a cluster's nodes (the executor's kind says), not on this machine."""
        return executor_kind(self.executor).cluster

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
