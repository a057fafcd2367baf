"""A tiny TOML writer for presets: strings, booleans, numbers, lists of those, and nested
tables. Enough that `tomllib.loads(dump_toml(d)) == d` for every preset; no dependency.

    dump_toml({"id": "x", "run": {"steps": 10, "cuda": {"precision": "bf16"}}})
    # id = "x"
    #
    # [run]
    # steps = 10
    #
    # [run.cuda]
    # precision = "bf16"
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _string(k)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # shortest text that reads back to the same float
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    raise TypeError(f"{where}: {v!r} ({type(v).__name__}) cannot be written as TOML here")


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML text for `data`: its plain values first, then each sub-table as [a.b]."""
    lines: list[str] = []
    _table(data, (), lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(data: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    plain = {k: v for k, v in data.items() if k not in tables}
    if path and (plain or not tables):
        lines.extend(["", "[" + ".".join(_key(p) for p in path) + "]"])
    for k, v in plain.items():
        lines.append(f"{_key(k)} = {_value(v, '.'.join((*path, k)))}")
    for k, v in tables.items():
        _table(v, (*path, k), lines)
