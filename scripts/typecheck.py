#!/usr/bin/env python3
"""Type-check the whole package with mypy, across modules.

    .venv/bin/python scripts/typecheck.py          # exit 0: no errors
    .venv/bin/python scripts/typecheck.py --strict # any mypy option passes through

Why not `mypy server workers drill`: an editable install finds crashdrill.* through an
import hook that mypy cannot follow, so every cross-module import was `Any` under
`ignore_missing_imports` and a call with the wrong arguments to another module passed
(e.g. a setting renamed in one module and still read in another). This lays the package
out as an installed wheel would (scripts/installed_layout.py), checks `-p crashdrill` and
the tests (`-p tests`, through a link to tests/) there with pyproject's [tool.mypy], and
prints each error with its path in this repo (crashdrill/trainer/NAME.py →
trainer/NAME.py). The tests are checked so that a `type: ignore` in them hides something
real: `warn_unused_ignores` fails one that hides nothing. Exit codes are mypy's: 0 clean,
1 errors, 2 a usage or crash.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from installed_layout import ROOT, laid_out, package_dirs, venv_tool


def repo_paths(text: str) -> str:
    """mypy's paths in the laid-out tree, as paths in the repository."""
    dirs = sorted(package_dirs().items(), key=lambda kv: -len(kv[0]))
    for name, folder in dirs:
        laid = name.replace(".", "/") + "/"
        text = re.sub(rf"(?m)^{re.escape(laid)}", folder.rstrip("/") + "/", text)
    return text


def main(argv: list[str]) -> int:
    tool = venv_tool("mypy", "mypy", "typecheck.py")
    if tool is None:
        return 2
    with laid_out("crashdrill-types-") as tmp:
        cmd = [str(tool), "--config-file", str(ROOT / "pyproject.toml")]
        (tmp / "tests").symlink_to(ROOT / "tests")
        cmd += ["--cache-dir", str(ROOT / ".mypy_cache"), "-p", "crashdrill", "-p", "tests", *argv]
        env = {**os.environ, "MYPYPATH": str(tmp)}
        done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
    sys.stdout.write(repo_paths(done.stdout))
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
