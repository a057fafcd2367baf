"""`crashdrill doctor postgres [URL]`: can the lab use this Postgres database?

    CRASHDRILL_DATABASE_URL='postgresql://…?sslmode=require' crashdrill doctor postgres
    crashdrill doctor postgres 'postgresql://USER:PASSWORD@HOST:5432/postgres'

Without URL it checks $CRASHDRILL_DATABASE_URL, the one `crashdrill serve` would use
(prefer that: a password on a command line is visible to every user of the machine).
Each step prints its time: connecting (server version, TLS), the round trip of one
statement (every query of the lab pays it), a write in a transaction that is rolled back
(a temporary table with an identity column, as the migrations make), the right to create
tables, and where the schema stands (migrations the next `crashdrill serve` applies). It
changes nothing. The password is masked everywhere. Exit 0: the database works; 1: a
step failed; 2: bad usage (no URL, a scheme other than postgresql:// or postgres://).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from crashdrill.server.storage.db import (
    DatabaseUnavailable,
    PostgresDatabase,
    available_migrations,
    check_postgres_url,
    mask_url,
)
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", help="postgresql://… (default: $CRASHDRILL_DATABASE_URL)")
    parser.description = (
        "Connect, time a round trip, write in a rolled-back transaction, check the right to"
        " create tables and the schema's version; print each step and, when one fails, why."
    )


class _Rollback(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("CRASHDRILL_DATABASE_URL", "").strip()
    if not url:
        print(
            "crashdrill doctor postgres: give a URL or set CRASHDRILL_DATABASE_URL",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        check_postgres_url(url)
    except ValueError as e:
        print(f"crashdrill doctor postgres: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"crashdrill doctor postgres: {mask_url(url)}", flush=True)
    db: PostgresDatabase | None = None

    def connect() -> str:
        nonlocal db
        db = PostgresDatabase(url)
        row = db.one("SELECT version() AS v, current_user AS u, current_database() AS d")
        assert row is not None
        ssl = db.one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        tls = "TLS" if ssl and ssl["ssl"] else "no TLS"
        return f"{row['v'].split(' on ')[0]}, user {row['u']}, database {row['d']}, {tls}"

    def round_trip() -> str:
        assert db is not None
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            db.one("SELECT 1 AS one")
            times.append(time.perf_counter() - t0)
        return f"median {statistics.median(times) * 1000:.1f} ms per statement"

    def write() -> str:
        assert db is not None
        try:
            with db.transaction():
                db.run(
                    "CREATE TEMPORARY TABLE crashdrill_doctor (id BIGINT GENERATED ALWAYS AS"
                    " IDENTITY PRIMARY KEY, data TEXT NOT NULL) ON COMMIT DROP"
                )
                ids = [
                    db.run("INSERT INTO crashdrill_doctor (data) VALUES (?) RETURNING id", (t,))
                    for t in ("a", "b")
                ]
                if [r[0]["id"] for r in ids] != [1, 2]:
                    raise RuntimeError(f"identity ids came back as {ids}, not 1 and 2")
                raise _Rollback
        except _Rollback:
            pass
        return "insert … returning id in a transaction, rolled back"

    def may_create() -> str:
        assert db is not None
        row = db.one(
            "SELECT current_schema() AS s, has_schema_privilege(current_schema(), 'CREATE') AS ok"
        )
        if not row or not row["ok"]:
            schema = row["s"] if row else None
            raise RuntimeError(
                f"this user may not create tables in schema {schema!r}: the migrations"
                " need that (GRANT CREATE ON SCHEMA … TO the user, or another user)"
            )
        return f"may create tables in schema {row['s']}"

    def schema() -> str:
        assert db is not None
        latest = available_migrations()[-1][0]
        exists = db.one("SELECT to_regclass('schema_migrations') IS NOT NULL AS yes")
        version = 0
        if exists and exists["yes"]:
            row = db.one("SELECT MAX(version) AS v FROM schema_migrations")
            version = int(row["v"]) if row and row["v"] is not None else 0
        if version > latest:
            raise RuntimeError(
                f"the schema is at version {version}, newer than this crashdrill ({latest}):"
                " upgrade crashdrill"
            )
        if version == latest:
            return f"version {version}, up to date"
        return f"version {version}; `crashdrill serve` applies {latest - version} migration(s)"

    steps: list[tuple[str, Callable[[], str]]] = [
        ("connect", connect),
        ("round trip", round_trip),
        ("write", write),
        ("create", may_create),
        ("schema", schema),
    ]
    try:
        for name, step in steps:
            if not _step(name, step):
                return EXIT_FAILED
    finally:
        if db is not None:
            db.close()
    print("The database works for the lab.", flush=True)
    return EXIT_OK


def _step(name: str, fn: Callable[[], str]) -> bool:
    t0 = time.perf_counter()
    try:
        detail = fn()
    except Exception as e:  # the step's failure is the diagnosis
        text = str(e) if isinstance(e, DatabaseUnavailable) else f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        print(f"  FAIL  {name:<10} {seconds:6.2f}s  {_one_line(text)}", flush=True)
        return False
    seconds = time.perf_counter() - t0
    print(f"  ok    {name:<10} {seconds:6.2f}s  {detail}", flush=True)
    return True


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())
