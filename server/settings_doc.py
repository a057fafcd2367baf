"""docs/server.md's settings tables, made from the sections' declarations
(server/settings_sections/): one table a section, a row a setting.

    .venv/bin/python scripts/settings_table.py          rewrite the tables in docs/server.md
    .venv/bin/python scripts/settings_table.py --check  exit 1 when they differ

tests/unit/test_settings_declared.py fails when docs/server.md's tables are not these.
"""

from __future__ import annotations

import re

from crashdrill.server.setting_schema import Declared, declared_fields
from crashdrill.server.settings_sections import SECTIONS

BEGIN = "<!-- settings tables: made by scripts/settings_table.py from server/settings_sections/ -->"
END = "<!-- end of the settings tables -->"
HEADER = "| setting | default | how to set | what |\n|---|---|---|---|"


def how_to_set(declared: Declared) -> str:
    """The "how to set" cell: the flag, the variable, the declared note; — when neither."""
    ways = []
    if declared.flag:
        flag = f"{declared.flag} {declared.metavar}" if declared.metavar else declared.flag
        ways.append(f"`{flag}`")
    if declared.env:
        ways.append(f"`{declared.env}`")
    text = ", ".join(ways) or "—"
    if declared.how_note:
        text += declared.how_note if declared.how_note.startswith(";") else f" {declared.how_note}"
    return text


def _cell(text: str) -> str:
    """A table cell: a | inside it would end the cell."""
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def settings_tables() -> str:
    """The markdown of every section's table, between the BEGIN and END markers."""
    parts = [BEGIN]
    for section in SECTIONS:
        rows = [
            f"| `{name}` | {_cell(d.default_text)} | {_cell(how_to_set(d))} | {_cell(d.what)} |"
            for name, d in declared_fields(section)
        ]
        rows += [f"| {' | '.join(map(_cell, other))} |" for other in section.OTHER_VARIABLES]
        parts += [f"**{section.TITLE}**", "\n".join([HEADER, *rows])]
    parts.append(END)
    return "\n\n".join(parts)


def with_tables(doc: str) -> str:
    """`doc` with the text between the markers replaced by the tables made now."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/server.md lacks the markers {BEGIN!r} … {END!r}")
    return doc[:start] + settings_tables() + doc[end + len(END) :]
