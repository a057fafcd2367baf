"""Server settings: `Settings`, the flat frozen view of the sections declared in
server/settings_sections/, with the checks that span settings, and the data dir's keys and
lock.

    Settings(data_dir=path, port=8080)   defaults, then these
    Settings.from_env(port=args.port)    defaults, then CRASHDRILL_* variables, then these

Every setting is in docs/server.md's table, generated from the declarations
(scripts/settings_table.py; a test fails when the two differ).
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from crashdrill.server.setting_schema import SettingsError, check_allowed
from crashdrill.server.settings_env import values_from_env
from crashdrill.server.settings_sections import (
    ClusterSection,
    FrontDoorSection,
    LabSection,
    RealtimeSection,
    StorageSection,
    StudentsSection,
)
from crashdrill.server.settings_sections.lab import default_data_dir as default_data_dir
from crashdrill.server.storage.db import check_postgres_url
from crashdrill.workers.executor_registry import ExecutorConfigError, executor_kind
from crashdrill.workers.mirror_backends import MirrorURLError, parse_mirror_url

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
class Settings(
    ClusterSection,
    RealtimeSection,
    StorageSection,
    FrontDoorSection,
    StudentsSection,
    LabSection,
):
    """Every setting of the lab, flat (`settings.port`, `dataclasses.replace(settings,
    port=...)`): the union of the sections declared in server/settings_sections/, lab's
    fields first. The checks here are the ones that span settings or machines; each
    setting's own range is declared beside it and checked by `check_allowed`."""

    def __post_init__(self) -> None:
        self._check_hardening()
        check_allowed(self)
        self._check_executor()
        if self.max_concurrent is None and not self.on_cluster:
            object.__setattr__(self, "max_concurrent", default_max_concurrent())
        if self.max_disk_bytes_per_run is None:
            object.__setattr__(self, "max_disk_bytes_per_run", default_disk_bytes_per_run())
        if self.max_disk_bytes_per_address is None:
            per_run = self.max_disk_bytes_per_run or 0
            object.__setattr__(self, "max_disk_bytes_per_address", 3 * per_run)
        self._check_class_limits()
        self._check_connections()
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
        from crashdrill.server.lessons.bounds import SERVER_LOCKED

        unknown = sorted(set(self.student_unlockable) - SERVER_LOCKED)
        if unknown:
            raise SettingsError(
                f"student_unlockable: {', '.join(unknown)} is not locked by the server;"
                f" allowed: {', '.join(sorted(SERVER_LOCKED))}"
            )

    def _check_connections(self) -> None:
        """The front door's caps (server/door/front_door.py)."""
        if not 1 <= self.max_connections_per_address <= self.max_connections:
            raise SettingsError(
                f"max_connections_per_address = {self.max_connections_per_address}: 1 to"
                f" max_connections ({self.max_connections})"
            )

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
        for origin in self.allowed_origins:
            if not re.fullmatch(r"https?://[^/\s?#]+", origin):
                raise SettingsError(
                    f"CRASHDRILL_ALLOWED_ORIGINS: {origin!r} is not an origin; give"
                    " scheme://host[:port], like https://lab.example.org"
                )
        from crashdrill.server.door.allowed_hosts import host_name_problem

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
