"""Shared test setup: one token cache per test session (never the user's ~/.cache), and a
helper that runs the real `crashdrill` CLI in a subprocess."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 (fixtures)

_CACHE = tempfile.mkdtemp(prefix="crashdrill-test-cache-")
os.environ.setdefault("CRASHDRILL_CACHE_DIR", _CACHE)
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)  # a session's own, gone with it
# Ray connects on first use unless told not to: a thread of a stopped lab calling Ray after
# a test module shut its cluster down would join another module's cluster (found by pgrep)
# or start one, and a driver whose cluster goes away ends this whole process with exit 1 a
# minute later, mid-suite, with no report. Every test connects explicitly (ray.init).
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
# The stand-in trainer's knobs reach it through the allowlist of workers/trainer_env.py.
os.environ.setdefault("CRASHDRILL_TRAINER_ENV_PASS", "CRASHDRILL_STANDIN_*")
# Starlette's TestClient sends `Host: testserver`; the lab answers only to its own names
# (server/door/allowed_hosts.py), so the in-process tests name it as an operator would.
os.environ.setdefault("CRASHDRILL_ALLOWED_HOSTS", "testserver")

REPO = Path(__file__).resolve().parent.parent
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def crashdrill_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crashdrill", *args]


def run_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        crashdrill_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def shakespeare() -> Path:
    if not SHAKESPEARE.is_file():
        pytest.skip("../shared/data/tinyshakespeare.txt is not beside this checkout")
    return SHAKESPEARE
