#!/usr/bin/env python3
"""Check the import-linter contracts of pyproject.toml (the layers; docs/layers.md).

    .venv/bin/python scripts/lint_imports.py            # exit 0: every contract kept
    .venv/bin/python scripts/lint_imports.py --verbose  # any lint-imports option passes through

Why not plain `lint-imports`: the source folders are mapped onto one namespace by
pyproject's `package-dir` (trainer/ is crashdrill.trainer, …), and an editable install
finds them through an import hook that import-linter's file walk cannot follow. So this
script lays the tree out as an installed wheel would (symlinks in a temp dir, built from
`package-dir`, so a new folder needs no edit here), puts it first on PYTHONPATH and runs
import-linter on it. Exit codes are lint-imports' own: 0 kept, 1 a contract broken.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def installed_layout(dest: Path) -> None:
    """dest/crashdrill/… as pip would install it, made of symlinks to the source folders."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    top = dest / "crashdrill"
    top.mkdir(parents=True)
    for entry in (ROOT / package_dir["crashdrill"]).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        if name != "crashdrill":
            (dest / name.replace(".", "/")).symlink_to(ROOT / folder)


def main(argv: list[str]) -> int:
    tool = Path(sys.executable).parent / "lint-imports"
    if not tool.exists():
        print(
            "scripts/lint_imports.py: import-linter is not installed in this environment:"
            " python3 quickstart.py setup --test",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="crashdrill-layers-") as tmp:
        installed_layout(Path(tmp))
        path = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        cmd = [str(tool), str(ROOT / "pyproject.toml"), "--no-cache", *argv]
        return subprocess.run(cmd, env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
