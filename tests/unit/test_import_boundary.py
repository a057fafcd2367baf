"""The trainer must import and run with no web stack installed (DESIGN.md)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_trainer_does_not_import_fastapi_or_the_server():
    code = (
        "import sys\n"
        "import crashdrill.trainer.loop, crashdrill.trainer.checkpoint\n"
        "import crashdrill.trainer.presets\n"
        "import crashdrill.cli\n"
        "bad = [m for m in ('fastapi', 'starlette', 'uvicorn', 'crashdrill.server') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_importing_the_mirror_does_not_import_torch():
    # workers/mirror.py promises this; the checkpoint layout it shares with the trainer
    # lives in trainer/checkpoint_files.py for that reason.
    code = (
        "import sys\n"
        "import crashdrill.workers.mirror, crashdrill.workers.mirror_restore\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
