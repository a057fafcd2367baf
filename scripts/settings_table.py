#!/usr/bin/env python3
"""Write docs/server.md's settings tables from the sections' declarations
(server/settings_sections/, rendered by server/settings_doc.py).

    .venv/bin/python scripts/settings_table.py          rewrite them
    .venv/bin/python scripts/settings_table.py --check  exit 1 when docs/server.md differs

Exit codes: 0 written or up to date, 1 differs (--check), 2 the markers are missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crashdrill.server.settings_doc import with_tables

DOC = Path(__file__).resolve().parents[1] / "docs" / "server.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it differs")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    try:
        made = with_tables(doc)
    except ValueError as e:
        print(f"settings_table: {e}", file=sys.stderr)
        return 2
    if made == doc:
        return 0
    if args.check:
        print(f"settings_table: {DOC} differs from the declarations: run {sys.argv[0]}")
        return 1
    DOC.write_text(made, encoding="utf-8")
    print(f"settings_table: wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
