"""A database row a test made and now reads: `present(store.run("r1"), "run r1")["step"]`.
The store's lookups return None for a missing row, which a test would otherwise index as
`None["step"]` (a TypeError that names nothing) or silence for the type checker; this
fails naming the row instead, and gives mypy the row's type."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None, what: str) -> T:
    """`value`, which the test expects to exist; fails naming `what` when it is None."""
    assert value is not None, f"no {what}"
    return value
