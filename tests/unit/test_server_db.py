"""The database layer: migrations and the one `run` function."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.server.db import Database, available_migrations, split_sql


def test_migrate_applies_every_migration_once(tmp_path: Path) -> None:
    db = Database(tmp_path / "lab.sqlite3")
    applied = db.migrate()
    assert applied == [v for v, _, _ in available_migrations()]
    assert db.migrate() == []
    assert db.schema_version() == applied[-1]
    tables = {r["name"] for r in db.run("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"pairs", "runs", "records", "telemetry", "schema_migrations"} <= tables


def test_migrations_resume_where_the_schema_stands(tmp_path: Path) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_first.sql").write_text("CREATE TABLE a (x INTEGER);")
    db = Database(tmp_path / "lab.sqlite3")
    assert db.migrate(d) == [1]
    (d / "0002_second.sql").write_text("-- a comment; with a semicolon\nCREATE TABLE b (y TEXT);")
    assert db.migrate(d) == [2]


def test_a_failing_migration_leaves_the_schema_as_it_was(tmp_path: Path) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_bad.sql").write_text("CREATE TABLE a (x INTEGER);\nNOT SQL AT ALL;")
    db = Database(tmp_path / "lab.sqlite3")
    with pytest.raises(Exception, match="syntax"):
        db.migrate(d)
    assert db.schema_version() == 0
    assert db.run("SELECT name FROM sqlite_master WHERE name = 'a'") == []


def test_migration_numbers_without_gaps_are_required(tmp_path: Path) -> None:
    (tmp_path / "0002_late.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="without gaps"):
        available_migrations(tmp_path)


def test_split_sql_drops_comments_and_empty_statements() -> None:
    assert split_sql("-- x;\nSELECT 1;\n\n;SELECT 2 -- two\n") == ["SELECT 1", "SELECT 2"]
