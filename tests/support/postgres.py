"""A real PostgreSQL server for the tests, started from the installed binaries in a temp dir.

    with PostgresServer.start() as server:        # initdb, postgres on 127.0.0.1:<free port>
        url = server.create_database("t1")        # postgresql://crashdrill:PASSWORD@…/t1

Fixtures (registered in tests/conftest.py): `postgres_server`, one server per test
session, and `postgres_url`, a fresh database per test. The binaries are found in
/usr/lib/postgresql/*/bin (newest first), then on PATH. Without them, or without psycopg,
the tests that need Postgres skip and say why; with CI=true they fail instead, so CI
really runs them (tests/support/extras.py: the rule of every optional extra). Postgres
refuses to run as root: as root the server runs as `nobody`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.storage.db import Database, PostgresDatabase
from tests.support.extras import require_extra, unavailable
from tests.support.lab import free_port

USER = "crashdrill"  # the superuser initdb creates
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 15
# A throwaway cluster: no fsync (a crash of the test machine loses nothing we keep).
FAST = [f"-c{o}" for o in ("fsync=off", "synchronous_commit=off", "full_page_writes=off")]


def find_bin_dir() -> Path | None:
    """A directory holding both `initdb` and `postgres`, or None."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
        reverse=True,
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for d in candidates:
        if (d / "initdb").is_file() and (d / "postgres").is_file():
            return d
    return None


class PostgresServer:
    """One `postgres` process on 127.0.0.1, its data dir and socket in a temp dir."""

    def __init__(self, bin_dir: Path, root: Path, run_as: pwd.struct_passwd | None) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.run_as = run_as
        self.password = secrets.token_urlsafe(12)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)

    @classmethod
    @contextlib.contextmanager
    def start(cls, bin_dir: Path | None = None) -> Iterator[PostgresServer]:
        bin_dir = bin_dir or find_bin_dir()
        if bin_dir is None:
            raise FileNotFoundError("no PostgreSQL binaries (initdb, postgres)")
        run_as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="crashdrill-pg-"))
        server = cls(bin_dir, root, run_as)
        try:
            server._initdb()
            server._launch()
            yield server
        finally:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _popen_args(self) -> dict[str, Any]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        args: dict[str, Any] = {"cwd": self.root, "env": env}
        if self.run_as is not None:
            args.update(user=self.run_as.pw_uid, group=self.run_as.pw_gid, extra_groups=[])
        return args

    def _own(self, *paths: Path) -> None:
        if self.run_as is not None:
            for p in paths:
                os.chown(p, self.run_as.pw_uid, self.run_as.pw_gid)

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        (self.root / "sock").mkdir()
        self._own(self.root, pwfile, self.root / "sock")
        data = str(self.root / "data")
        auth = ["--auth-local=trust", "--auth-host=scram-sha-256"]
        options = ["--encoding=UTF8", "--locale=C", "--no-sync", f"--pwfile={pwfile}", *auth]
        done = subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", data, "-U", USER, *options],
            capture_output=True,
            text=True,
            timeout=120,
            **self._popen_args(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def _launch(self) -> None:
        import psycopg

        for _attempt in range(3):  # another process may take the free port first
            self.port = free_port()
            log = open(self.root / "postgres.log", "wb")  # noqa: SIM115 (outlives this call)
            where = ["-k", str(self.root / "sock"), "-h", "127.0.0.1", "-p", str(self.port)]
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.root / "data"), *where, *FAST],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._popen_args(),
            )
            log.close()
            deadline = time.monotonic() + START_TIMEOUT_S
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    psycopg.connect(self.url(), connect_timeout=2).close()
                    return
                except psycopg.OperationalError:
                    time.sleep(0.05)
            if self.proc.poll() is None:  # neither up nor gone: give up
                break
            if "could not bind" not in self.log_tail():
                break
        self.stop()
        raise RuntimeError(f"postgres did not start on port {self.port}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL past STOP_TIMEOUT_S."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def _admin(self, statement: str, name: str) -> None:
        import psycopg
        from psycopg import sql

        query = sql.SQL(statement).format(sql.Identifier(name))
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(query)

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self._admin("CREATE DATABASE {}", name)
        return self.url(name)

    def drop_database(self, url: str) -> None:
        self._admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    require_extra("postgres")
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable("no PostgreSQL binaries in /usr/lib/postgresql/*/bin or on PATH")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            unavailable("running as root, and there is no user `nobody` to run postgres as")
    with PostgresServer.start(bin_dir) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped after the test."""
    url = postgres_server.create_database()
    try:
        yield url
    finally:
        postgres_server.drop_database(url)


def open_test_database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Database:
    """An empty database of `backend` ("sqlite" or "postgres") for one test."""
    if backend == "sqlite":
        return Database(tmp_path / "lab.sqlite3")
    if backend == "postgres":
        return PostgresDatabase(request.getfixturevalue("postgres_url"))
    raise ValueError(f"backend = {backend!r}: 'sqlite' or 'postgres'")


def table_names(db: Database) -> set[str]:
    if db.dialect == "postgres":
        sql = "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = ?"
        return {r["name"] for r in db.run(sql, ("public",))}
    return {r["name"] for r in db.run("SELECT name FROM sqlite_master WHERE type = 'table'")}
