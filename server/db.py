"""The database: plain SQL with `?` parameters behind one function, `Database.run`.

SQLite (a file in the data dir) is the embedded default. Everything above this module
speaks SQL that SQLite and Postgres both accept (`INSERT ... ON CONFLICT DO NOTHING`,
`?` placeholders that a Postgres driver's `%s` replaces in `run`), so the Postgres port
is a second connection type here and a dialect switch in the migrations, nothing more.

Migrations are numbered files in `migrations/` (`0001_initial.sql`, ...), applied in order
inside a transaction each and remembered in `schema_migrations`.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

Row = dict[str, Any]


class Database:
    """One SQLite connection shared by the server's threads, one statement at a time."""

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
        """Apply the migrations newer than the schema; the versions applied."""
        current = self.schema_version()
        applied = []
        for version, name, path in available_migrations(directory):
            if version <= current:
                continue
            statements = split_sql(path.read_text(encoding="utf-8"))
            with self.transaction():
                for statement in statements:
                    self.run(statement)
                self.run(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            applied.append(version)
        return applied


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


def split_sql(text: str) -> list[str]:
    """Statements of a migration file (no `;` inside strings or triggers, by rule)."""
    lines = [line.split("--", 1)[0] for line in text.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
