"""`crashdrill run` works on a machine without the web stack (a GPU worker's image): the
command line loads the server only inside the commands that need it. The layers
themselves (the trainer imports no web stack, the mirror no torch, nothing imports
upwards) are import-linter contracts in pyproject.toml, checked by
scripts/lint_imports.py in CI; this is the one property they cannot see, because
import-linter counts an import inside a function like any other."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_command_line_loads_neither_the_server_nor_the_web_stack():
    code = (
        "import sys\n"
        "import crashdrill.cli, crashdrill.trainer.loop\n"
        "bad = [m for m in ('fastapi', 'starlette', 'uvicorn', 'crashdrill.server') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
