"""SQL text both backends accept (server/storage/sql_text.py): placeholders, dialect lines and
SET clauses."""

from __future__ import annotations

import pytest

from crashdrill.server.storage.sql_text import is_read, set_clause, split_sql, to_pyformat


def test_split_sql_drops_comments_and_empty_statements() -> None:
    assert split_sql("-- x;\nSELECT 1;\n\n;SELECT 2 -- two\n") == ["SELECT 1", "SELECT 2"]


def test_split_sql_keeps_the_lines_of_its_dialect_only() -> None:
    text = "SELECT 1;\n-- sqlite: SELECT 2;\n  -- postgres: SELECT 3;\n-- Postgres: prose\n"
    assert split_sql(text, "sqlite") == ["SELECT 1", "SELECT 2"]
    assert split_sql(text, "postgres") == ["SELECT 1", "SELECT 3"]
    with pytest.raises(ValueError, match="dialect = 'mysql'"):
        split_sql(text, "mysql")


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT a WHERE a = ? AND b IN (?, ?)", "SELECT a WHERE a = %s AND b IN (%s, %s)"),
        ("SELECT '?', 'it''s ?', ? FROM t", "SELECT '?', 'it''s ?', %s FROM t"),
        ('SELECT "odd?name" FROM t WHERE x = ?', 'SELECT "odd?name" FROM t WHERE x = %s'),
        ("SELECT 1 -- why?\n, ?", "SELECT 1 -- why?\n, %s"),
        ("SELECT /* ? */ ?", "SELECT /* ? */ %s"),
        ("SELECT E'\\' ?', ?", "SELECT E'\\' ?', %s"),
        ("SELECT 'a\\', ?", "SELECT 'a\\', %s"),  # standard strings: backslash is plain
        ("SELECT $$ ? $$, $q$ ? $q$, ?", "SELECT $$ ? $$, $q$ ? $q$, %s"),
        ("SELECT '50%' || ? || 100 % 7", "SELECT '50%%' || %s || 100 %% 7"),
    ],
)  # fmt: skip
def test_placeholders_become_psycopgs_outside_literals(sql: str, expected: str) -> None:
    assert to_pyformat(sql) == expected


def test_a_set_clause_names_each_column_and_refuses_one_not_allowed() -> None:
    assert set_clause({"state": "x", "pid": 1}, {"state", "pid", "step"}) == "state = ?, pid = ?"
    with pytest.raises(ValueError, match=r"not a run column: \['colour; DROP'\]"):
        set_clause({"state": "x", "colour; DROP": 1}, {"state"}, "run column")


def test_only_a_statement_that_reads_counts_as_a_read() -> None:
    assert is_read("  select 1") and is_read("WITH x AS (SELECT 1) SELECT * FROM x")
    assert not is_read("INSERT INTO t VALUES (1)") and not is_read("UPDATE t SET a = 1")
