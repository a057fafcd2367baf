"""The database: plain SQL with `?` parameters behind one function, `Database.run`.

Two backends, one interface (`run`, `run_many`, `one`, `transaction`, `migrate`, `close`):

- `Database(path)`: SQLite, a file in the data dir. The embedded default.
- `PostgresDatabase(url)`: Postgres through psycopg 3 (`pip install 'crashdrill[postgres]'`)
  when `CRASHDRILL_DATABASE_URL=postgresql://…` is set; a Supabase project's connection
  string works as it is (`?sslmode=require` and the rest go to libpq untouched).

`open_database(settings)` picks one. Everything above this module speaks SQL that both
accept (server/storage/sql_text.py rewrites and splits it): `?` placeholders (translated to
psycopg's `%s` outside string literals, quoted names and comments), `INSERT … ON CONFLICT
DO NOTHING RETURNING id`, TEXT, INTEGER, BIGINT and DOUBLE PRECISION columns (no NUMERIC:
psycopg would return Decimal; BIGINT where a value comes from a file, as SQLite's INTEGER
is 64-bit), no `IN ()` with an empty list, no booleans stored in INTEGER columns.
Postgres text cannot hold a NUL character: one in a parameter becomes U+FFFD there.

Both backends serialise statements through one connection and a lock: record ids must
become visible in id order, or a reader paging with `id > after` could skip a row that
commits late. A transaction holds the lock until it ends, so it is the calling thread's
alone; transactions do not nest.

Migrations are numbered files in `migrations/` (`0001_initial.sql`, ...), applied in
order inside a transaction each and remembered in `schema_migrations`. A line that starts
with `-- sqlite:` or `-- postgres:` is SQL for that dialect only (the rest of the line),
and a comment for the other; write the two variants on adjacent lines:

    -- sqlite: id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- postgres: id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from crashdrill.server.storage.sql_text import is_read, split_sql, to_pyformat

if TYPE_CHECKING:
    import psycopg

    from crashdrill.server.settings import Settings

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
POSTGRES_SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 10
MIGRATION_LOCK_KEY = int.from_bytes(b"crashdri", "big") >> 1  # a signed 64-bit key

Row = dict[str, Any]


class DatabaseUnavailable(Exception):
    """The configured database cannot be used; the message says why (password masked)."""


class MigrationError(DatabaseUnavailable):
    """The schema could not be brought up to date; the text names the version."""


class Database:
    """One SQLite connection shared by the server's threads, one statement at a time."""

    dialect = "sqlite"
    # Called after every statement that reached the database (any thread): the lab's
    # outage tracker learns the end of an outage from whichever caller gets through first,
    # not only from the ingest loop (which may be sleeping its backoff meanwhile).
    reached: Callable[[], None] | None = None

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (see `transaction`).
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        for pragma in (
            "PRAGMA journal_mode=WAL",  # readers do not block the ingest writer
            "PRAGMA synchronous=NORMAL",  # a power cut may lose the last commits, never corrupt
            "PRAGMA foreign_keys=ON",
            "PRAGMA busy_timeout=5000",
            # No checkpoints on commit: they fsync, and a commit on the event loop's thread
            # would stall every stream for tens of ms. A thread checkpoints instead.
            "PRAGMA wal_autocheckpoint=0",
        ):
            self._conn.execute(pragma)
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if self.path != ":memory:":
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="sqlite-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def describe(self) -> str:
        """Where the data lives, safe to print."""
        return f"SQLite at {self.path}"

    def _checkpoint_loop(self, every_s: float = 1.0) -> None:
        """Copy the WAL into the database file, off the event loop's thread."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=5000")
            while not self._stop.wait(every_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:  # busy or closing: next time
                    continue
        finally:
            conn.close()

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Execute one statement; the rows it returns as dicts (empty for writes)."""
        with self._lock:
            cur = self._conn.execute(sql, tuple(params))
            rows = cur.fetchall()
        return [dict(r) for r in rows]

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._lock:
            self._conn.executemany(sql, [tuple(r) for r in rows])

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = self.run(sql, params)
        return rows[0] if rows else None

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        """BEGIN … COMMIT, or ROLLBACK when the block raises; other threads wait."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join(5)
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()

    # ---- migrations -----------------------------------------------------------------

    def schema_version(self) -> int:
        self.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION)"
        )
        row = self.one("SELECT MAX(version) AS v FROM schema_migrations")
        return int(row["v"]) if row and row["v"] is not None else 0

    def migrate(self, directory: Path = MIGRATIONS_DIR) -> list[int]:
        """Apply the migrations newer than the schema; the versions applied.

        Each runs in its own transaction, all under the migration lock (SQLite: the
        write lock of each BEGIN IMMEDIATE; Postgres: an advisory lock held for the
        whole call), which reads the version again: servers sharing one database and
        starting together apply each migration once. A database migrated by a newer
        crashdrill, or a migration that fails, raises MigrationError naming the version
        and the database."""
        with self._migration_lock():
            return self._migrate(available_migrations(directory))

    def _migrate(self, available: list[tuple[int, str, Path]]) -> list[int]:
        known = available[-1][0] if available else 0
        current = self.schema_version()
        if current > known:
            raise MigrationError(
                f"{self.describe()} has schema version {current}, but this crashdrill knows"
                f" versions up to {known}: a newer crashdrill migrated it; upgrade this one"
                " (pip install -U crashdrill) or point it at another database"
            )
        applied = []
        for version, name, path in available:
            if version <= current:
                continue
            statements = split_sql(path.read_text(encoding="utf-8"), self.dialect)
            try:
                with self.transaction():
                    if self.schema_version() >= version:  # another server got here first
                        continue
                    for statement in statements:
                        self.run(statement)
                    self.run(
                        "INSERT INTO schema_migrations (version, name, applied_at)"
                        " VALUES (?, ?, ?)",
                        (version, name, time.time()),
                    )
            except DatabaseUnavailable:
                raise
            except Exception as e:
                raise MigrationError(
                    f"migration {version:04d}_{name} failed on {self.describe()} and was"
                    f" rolled back: {self._scrub(str(e))}"
                ) from e
            applied.append(version)
        return applied

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """Serialise migrations across servers (SQLite's BEGIN IMMEDIATE already does)."""
        yield

    def _scrub(self, text: str) -> str:
        return " ".join(text.split())


class PostgresDatabase(Database):
    """The same interface over one psycopg connection (autocommit between transactions).

    A connection that broke while idle (a pooler or the server closed it) is replaced on
    the next statement; a read that failed on it is retried once, a write never (it may
    have been applied). Prepared statements are off, so Supabase's transaction pooler
    (port 6543) works as well as the session pooler and the direct connection.
    """

    dialect = "postgres"

    def __init__(self, url: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        check_postgres_url(url)
        self.url = url
        self.path = mask_url(url)  # what a person may see: never the password
        self._timeout = connect_timeout_s
        self._lock = threading.RLock()
        self._in_transaction = False
        self._closed = False
        self._pg: psycopg.Connection[Row] = self._connect()

    def describe(self) -> str:
        return f"Postgres at {self.path}"

    def _connect(self) -> psycopg.Connection[Row]:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
            from psycopg.rows import dict_row
        except ImportError:
            raise DatabaseUnavailable(
                f"the database URL {self.path} needs psycopg: pip install 'crashdrill[postgres]'"
            ) from None
        try:
            given = conninfo_to_dict(self.url)
            extra: dict[str, Any] = {}
            if "connect_timeout" not in given:
                extra["connect_timeout"] = max(1, round(self._timeout))
            if "application_name" not in given:
                extra["application_name"] = "crashdrill"
            conn = psycopg.connect(
                self.url, autocommit=True, row_factory=dict_row, prepare_threshold=None, **extra
            )
        except psycopg.Error as e:
            raise DatabaseUnavailable(
                f"cannot connect to the database at {self.path}: {self._scrub(str(e))}"
            ) from None
        return conn

    def _scrub(self, text: str) -> str:
        """`text` on one line, without the password should a driver message ever quote it."""
        text = "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())
        for secret in _passwords(self.url):
            text = text.replace(secret, "***")
        return text

    def _execute(self, sql: str, params: Sequence[Any], many: bool = False) -> list[Row]:
        import psycopg

        query = to_pyformat(sql)
        with self._lock:
            if self._closed:
                raise DatabaseUnavailable(f"the connection to {self.path} was closed")
            for attempt in (1, 2):
                if not self._in_transaction and (self._pg.closed or self._pg.broken):
                    self._pg = self._connect()
                conn = self._pg
                try:
                    with conn.cursor() as cur:
                        if many:
                            cur.executemany(query, [_without_nul(p) for p in params])
                            rows: list[Row] = []
                        else:
                            cur.execute(query, _without_nul(params))
                            rows = cur.fetchall() if cur.description is not None else []
                    if self.reached is not None:
                        self.reached()
                    return rows
                except psycopg.OperationalError as e:
                    retry = attempt == 1 and conn.broken and not self._in_transaction
                    if retry and is_read(sql):
                        continue
                    if conn.broken:
                        raise DatabaseUnavailable(
                            f"the connection to the database at {self.path} was lost:"
                            f" {self._scrub(str(e))}"
                        ) from None
                    raise
        raise AssertionError("unreachable")

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._execute(sql, params)

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._execute(sql, rows, many=True)

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        """BEGIN … COMMIT, or ROLLBACK when the block raises; other threads wait."""
        with self._lock:
            if self._in_transaction:
                raise RuntimeError("transactions do not nest (SQLite's do not either)")
            self.run("BEGIN")
            self._in_transaction = True
            try:
                yield self
            except BaseException:
                self._in_transaction = False
                if not self._pg.broken:
                    with contextlib.suppress(Exception):  # keep the error that got us here
                        self.run("ROLLBACK")
                raise
            self._in_transaction = False
            self.run("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pg.close()

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """A session advisory lock: one server migrates, the others wait, then find the
        schema current. The key is crashdrill's own (the first 8 bytes of its name)."""
        with self._lock:
            self.run("SELECT pg_advisory_lock(?)", (MIGRATION_LOCK_KEY,))
            try:
                yield
            finally:
                if not self._pg.broken:  # a broken connection dropped the lock with it
                    with contextlib.suppress(Exception):
                        self.run("SELECT pg_advisory_unlock(?)", (MIGRATION_LOCK_KEY,))


def open_database(settings: Settings) -> Database:
    """Postgres when `settings.database_url` is set, else SQLite in the data dir."""
    if settings.database_url:
        return PostgresDatabase(settings.database_url)
    return Database(settings.db_path)


# ---- URLs -----------------------------------------------------------------------------


def check_postgres_url(url: str, name: str = "database URL") -> None:
    """ValueError naming the (masked) URL unless it is a postgresql:// or postgres:// URL."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in POSTGRES_SCHEMES:
        allowed = " or ".join(f"{s}://" for s in POSTGRES_SCHEMES)
        raise ValueError(
            f"{name} = {mask_url(url)!r}: the scheme must be {allowed}"
            " (leave it unset for SQLite in the data dir)"
        )


def mask_url(url: str) -> str:
    """`url` with its password replaced by `***`: postgresql://user:***@host:5432/db.

    Errs on the side of hiding: a password with an unencoded `@` or `/` is still masked.
    """
    masked = re.sub(r"^([^:/?#]+://[^:/?#@]*):.*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", masked, flags=re.IGNORECASE)


def _passwords(url: str) -> list[str]:
    """Every reading of the password in `url` (long enough to replace without garbling)."""
    found = re.findall(r"^[^:/?#]+://[^:/?#@]*:(.*)@", url)  # up to the last @
    found += re.findall(r"^[^:/?#]+://[^:/?#@]*:([^@]*)@", url)  # up to the first @
    found += re.findall(r"[?&]password=([^&#]+)", url, flags=re.IGNORECASE)
    found += [unquote(p) for p in found]
    return sorted({p for p in found if len(p) >= 4}, key=len, reverse=True)


def _without_nul(params: Sequence[Any]) -> tuple[Any, ...]:
    """Postgres text cannot hold NUL: it is stored and compared as U+FFFD instead."""
    return tuple(
        p.replace("\x00", "\ufffd") if isinstance(p, str) and "\x00" in p else p for p in params
    )


# ---- migrations -----------------------------------------------------------------------


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[tuple[int, str, Path]]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION.match(path.name)
        if not match:
            raise ValueError(f"{path}: migration files are named NNNN_name.sql")
        found.append((int(match.group(1)), match.group(2), path))
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"{directory}: migration numbers must run 1, 2, 3… without gaps")
    return found
