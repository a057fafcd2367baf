"""The database layer: migrations and the one `run` function, on SQLite and on a real
Postgres (tests/support/postgres.py starts one; `-k sqlite` runs without it)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crashdrill.server.storage.db import (
    Database,
    MigrationError,
    available_migrations,
    mask_url,
)
from tests.support.postgres import open_test_database, table_names
from tests.support.rows import present

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def new_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Database]]:
    """Opens the test's database (the same one each call), closed after the test."""
    opened: list[Database] = []

    def open_() -> Database:
        opened.append(open_test_database(request.param, tmp_path, request))
        return opened[-1]

    yield open_
    for db in opened:
        db.close()


def test_migrate_applies_every_migration_once(new_db: Callable[[], Database]) -> None:
    db = new_db()
    applied = db.migrate()
    assert applied == [v for v, _, _ in available_migrations()]
    assert db.migrate() == []
    assert db.schema_version() == applied[-1]
    assert {"pairs", "runs", "records", "telemetry", "schema_migrations"} <= table_names(db)
    assert new_db().migrate() == [], "a second connection sees the migrated schema"


def test_migrations_resume_where_the_schema_stands(
    new_db: Callable[[], Database], tmp_path: Path
) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_first.sql").write_text("CREATE TABLE a (x INTEGER);")
    db = new_db()
    assert db.migrate(d) == [1]
    (d / "0002_second.sql").write_text("-- a comment; with a semicolon\nCREATE TABLE b (y TEXT);")
    assert db.migrate(d) == [2]


def test_a_failing_migration_leaves_the_schema_as_it_was(
    new_db: Callable[[], Database], tmp_path: Path
) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_bad.sql").write_text("CREATE TABLE a (x INTEGER);\nNOT SQL AT ALL;")
    db = new_db()
    with pytest.raises(MigrationError, match=r"migration 0001_bad failed on .*syntax") as e:
        db.migrate(d)
    assert db.describe() in str(e.value) and "rolled back" in str(e.value)
    assert db.schema_version() == 0
    assert "a" not in table_names(db)


def test_a_schema_from_a_newer_crashdrill_is_refused_by_name(
    new_db: Callable[[], Database], tmp_path: Path
) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_first.sql").write_text("CREATE TABLE a (x INTEGER);")
    (d / "0002_second.sql").write_text("CREATE TABLE b (y TEXT);")
    db = new_db()
    assert db.migrate(d) == [1, 2]
    (d / "0002_second.sql").unlink()  # this crashdrill only knows version 1
    with pytest.raises(MigrationError, match="schema version 2, but this crashdrill knows"):
        db.migrate(d)


def test_servers_starting_together_apply_each_migration_once(
    new_db: Callable[[], Database], tmp_path: Path
) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    for i in range(1, 6):
        (d / f"{i:04d}_m{i}.sql").write_text(f"CREATE TABLE t{i} (x INTEGER);")
    dbs = [new_db() for _ in range(3)]
    start = threading.Barrier(len(dbs))
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def migrate(db: Database) -> None:
        start.wait()
        try:
            applied.append(db.migrate(d))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=migrate, args=(db,)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(v for a in applied for v in a) == [1, 2, 3, 4, 5]
    assert dbs[0].run("SELECT COUNT(*) AS n FROM schema_migrations")[0]["n"] == 5


def test_dialect_lines_pick_the_sql_of_each_backend(
    new_db: Callable[[], Database], tmp_path: Path
) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_ids.sql").write_text(
        "CREATE TABLE a (\n"
        "    -- sqlite: id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
        "    -- postgres: id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n"
        "    x TEXT\n"
        ");\n"
        "-- sqlite: CREATE TABLE only_sqlite (x TEXT);\n"
        "-- postgres: CREATE TABLE only_postgres (x TEXT);\n"
    )
    db = new_db()
    db.migrate(d)
    ids = [db.run("INSERT INTO a (x) VALUES (?) RETURNING id", (s,))[0]["id"] for s in "pq"]
    assert ids == [1, 2]
    other = "postgres" if db.dialect == "sqlite" else "sqlite"
    assert f"only_{db.dialect}" in table_names(db)
    assert f"only_{other}" not in table_names(db)


def test_rows_are_dicts_with_the_types_both_backends_agree_on(
    new_db: Callable[[], Database],
) -> None:
    db = new_db()
    db.migrate()
    db.run(
        "INSERT INTO pairs (id, owner, preset, preset_json, created_at) VALUES (?, ?, ?, ?, ?)",
        ("p1", "o", "quick", "{}", 1.5),
    )
    row = db.one(
        "SELECT id, created_at, COUNT(*) AS n, '50%' AS pct, 'why?' AS q FROM pairs"
        " WHERE id = ? GROUP BY id, created_at",
        ("p1",),
    )
    assert row == {"id": "p1", "created_at": 1.5, "n": 1, "pct": "50%", "q": "why?"}
    assert db.one("SELECT id FROM pairs WHERE id = ?", ("nope",)) is None
    big = 2**40  # step and segment hold 64-bit values on both
    db.run(
        "INSERT INTO runs (id, pair_id, label, preset, run_dir, state, queued_at, step)"
        " VALUES (?, ?, 'A', 'quick', '/r', 'queued', 1.0, ?)",
        ("r1", "p1", big),
    )
    assert present(db.one("SELECT step FROM runs"), "row")["step"] == big


def test_a_nul_character_in_a_parameter_finds_nothing_and_breaks_nothing(
    new_db: Callable[[], Database],
) -> None:
    db = new_db()
    db.migrate()
    assert db.one("SELECT id FROM pairs WHERE id = ?", ("a\x00b",)) is None


def test_run_many_inserts_every_row(new_db: Callable[[], Database]) -> None:
    db = new_db()
    db.migrate()
    db.run_many(
        "INSERT INTO telemetry (t, data) VALUES (?, ?)", [(float(i), "{}") for i in range(5)]
    )
    assert db.one("SELECT COUNT(*) AS n FROM telemetry") == {"n": 5}


def test_a_transaction_commits_or_rolls_back_as_a_whole(new_db: Callable[[], Database]) -> None:
    db = new_db()
    db.migrate()
    insert = "INSERT INTO telemetry (t, data) VALUES (?, ?)"
    with pytest.raises(RuntimeError, match="boom"), db.transaction():
        db.run(insert, (1.0, "{}"))
        raise RuntimeError("boom")
    assert db.one("SELECT COUNT(*) AS n FROM telemetry") == {"n": 0}
    with db.transaction():
        db.run(insert, (2.0, "{}"))
    assert db.one("SELECT COUNT(*) AS n FROM telemetry") == {"n": 1}
    with pytest.raises(Exception, match="transaction"), db.transaction(), db.transaction():
        pass
    db.run(insert, (3.0, "{}"))  # the connection is usable after all that
    assert db.one("SELECT COUNT(*) AS n FROM telemetry") == {"n": 2}


def test_other_threads_wait_for_a_transaction_and_never_see_half_of_it(
    new_db: Callable[[], Database],
) -> None:
    db = new_db()
    db.migrate()
    seen: list[int] = []
    inside = threading.Event()

    def count() -> None:
        inside.wait(5)
        seen.append(present(db.one("SELECT COUNT(*) AS n FROM telemetry"), "row")["n"])

    reader = threading.Thread(target=count)
    reader.start()
    with db.transaction():
        db.run("INSERT INTO telemetry (t, data) VALUES (?, ?)", (1.0, "{}"))
        inside.set()
        reader.join(0.3)
        assert reader.is_alive(), "the reader ran inside another thread's transaction"
        db.run("INSERT INTO telemetry (t, data) VALUES (?, ?)", (2.0, "{}"))
    reader.join(5)
    assert seen == [2]


def test_migration_numbers_without_gaps_are_required(tmp_path: Path) -> None:
    (tmp_path / "0002_late.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="without gaps"):
        available_migrations(tmp_path)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db"),
        (
            "postgres://postgres.abcd:p%40ss@aws-0-eu.pooler.supabase.com:5432/postgres"
            "?sslmode=require",
            "postgres://postgres.abcd:***@aws-0-eu.pooler.supabase.com:5432/postgres"
            "?sslmode=require",
        ),
        ("postgresql://u:p@ss/w@rd@h/db", "postgresql://u:***@h/db"),  # unencoded: still hidden
        ("postgresql://u@h/db?password=s3cret&ssl=1", "postgresql://u@h/db?password=***&ssl=1"),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
        ("postgresql:///db", "postgresql:///db"),
    ],
)  # fmt: skip
def test_urls_are_shown_with_the_password_masked(url: str, expected: str) -> None:
    assert mask_url(url) == expected
