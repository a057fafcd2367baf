#!/usr/bin/env python3
"""Check the import-linter contracts of pyproject.toml (the layers: docs/development.md,
"The layers, checked by import-linter").

    .venv/bin/python scripts/lint_imports.py            # exit 0: every contract kept
    .venv/bin/python scripts/lint_imports.py --verbose  # any lint-imports option passes through

Why not plain `lint-imports`: an editable install finds the source folders through an
import hook that import-linter's file walk cannot follow. So this script lays the tree out
as an installed wheel would (scripts/installed_layout.py: symlinks in a temp dir), puts it
first on PYTHONPATH and runs import-linter on it. Exit codes are lint-imports' own: 0 kept,
1 a contract broken.
"""

from __future__ import annotations

import os
import subprocess
import sys

from installed_layout import ROOT, laid_out, venv_tool


def main(argv: list[str]) -> int:
    tool = venv_tool("lint-imports", "import-linter", "lint_imports.py")
    if tool is None:
        return 2
    with laid_out("crashdrill-layers-") as tmp:
        path = os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        cmd = [str(tool), str(ROOT / "pyproject.toml"), "--no-cache", *argv]
        return subprocess.run(cmd, env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
