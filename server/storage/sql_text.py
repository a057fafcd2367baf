"""SQL text that both database backends accept, and the helpers that write or rewrite it.

    to_pyformat("SELECT * FROM runs WHERE id = ? AND note = 'why?'")
    # "SELECT * FROM runs WHERE id = %s AND note = 'why?'"      (psycopg's placeholders)
    split_sql(migration_text, "postgres")   # its statements, for that dialect
    set_clause({"step": 300, "pid": 7}, {"step", "pid"})   # "step = ?, pid = ?"

Everything above server/storage/db.py writes SQL with `?` placeholders; Postgres gets them as
`%s`, outside string literals, quoted names and comments. A migration line that starts
with `-- sqlite:` or `-- postgres:` is SQL for that dialect only (the rest of the line),
and a comment for the other. The rules for SQL both accept are in db.py's docstring.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping
from typing import Any

DIALECTS = ("sqlite", "postgres")
_DIALECT_LINE = re.compile(r"^\s*--\s*(sqlite|postgres):(.*)$")


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """`?` placeholders → psycopg's `%s`, and every literal `%` → `%%`.

    A `?` inside a string literal ('…', E'…', $tag$…$tag$), a quoted name ("…") or a
    comment stays as it is.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        end = i + 1
        if c == "'":
            prefix = sql[max(0, i - 2) : i]
            backslash = prefix[-1:] in ("e", "E") and not (
                prefix[:1].isalnum() or prefix[:1] == "_"
            )
            end = _string_end(sql, i, backslash)
        elif c == '"':
            end = _string_end(sql, i, False, quote='"')
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif c == "$" and (m := re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", sql[i:])):
            close = sql.find(m.group(0), i + len(m.group(0)))
            end = n if close < 0 else close + len(m.group(0))
        elif c == "?":
            out.append("%s")
            i += 1
            continue
        out.append(sql[i:end].replace("%", "%%"))
        i = end
    return "".join(out)


def _string_end(sql: str, start: int, backslash: bool, quote: str = "'") -> int:
    """Index just past the literal that opens at `start` (doubled quotes stay inside)."""
    i = start + 1
    while i < len(sql):
        if backslash and sql[i] == "\\":
            i += 2
            continue
        if sql[i] == quote:
            if sql.startswith(quote, i + 1):
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def split_sql(text: str, dialect: str = "sqlite") -> list[str]:
    """Statements of a migration file for `dialect` (no `;` inside strings, by rule)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect = {dialect!r}: 'sqlite' or 'postgres'")
    lines = []
    for line in text.splitlines():
        variant = _DIALECT_LINE.match(line)
        if variant:
            line = variant.group(2) if variant.group(1) == dialect else ""
        lines.append(line.split("--", 1)[0])
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def is_read(sql: str) -> bool:
    """A statement that only reads (a broken connection may retry it)."""
    return sql.lstrip().upper().startswith(("SELECT", "WITH", "SHOW"))


def set_clause(fields: Mapping[str, Any], allowed: Collection[str], what: str = "column") -> str:
    """`a = ?, b = ?` for the names in `fields`; a name not in `allowed` is refused (the
    names go into the SQL text, the values are parameters), naming it as a `what`."""
    unknown = set(fields) - set(allowed)
    if unknown:
        raise ValueError(f"not a {what}: {sorted(unknown)}")
    return ", ".join(f"{k} = ?" for k in fields)
