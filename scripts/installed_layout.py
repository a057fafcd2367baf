"""The package laid out as an installed wheel would be, for tools that walk files.

The source folders are mapped onto one namespace by pyproject's `package-dir` (trainer/ is
crashdrill.trainer, …), and an editable install finds them through an import hook that
file-walking tools (import-linter, mypy) cannot follow: to them every `crashdrill.*`
import is missing. `installed_layout(dest)` makes dest/crashdrill/… out of symlinks to
the source folders, built from `package-dir`, so a new folder needs no edit here.
"""

from __future__ import annotations

import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    """{"crashdrill.trainer": "trainer", …} from pyproject.toml."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    return dirs


def installed_layout(dest: Path) -> None:
    """dest/crashdrill/… as pip would install it, made of symlinks to the source folders."""
    package_dir = package_dirs()
    top = dest / "crashdrill"
    top.mkdir(parents=True)
    for entry in (ROOT / package_dir["crashdrill"]).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        if name != "crashdrill":
            (dest / name.replace(".", "/")).symlink_to(ROOT / folder)


def venv_tool(command: str, package: str, script: str) -> Path | None:
    """The venv's `command` (beside this Python), or None after telling how to install it."""
    tool = Path(sys.executable).parent / command
    if tool.exists():
        return tool
    print(
        f"scripts/{script}: {package} is not installed in this environment:"
        " python3 quickstart.py setup --test",
        file=sys.stderr,
    )
    return None


@contextmanager
def laid_out(prefix: str) -> Iterator[Path]:
    """A temp dir holding the installed layout, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        installed_layout(Path(tmp))
        yield Path(tmp)
