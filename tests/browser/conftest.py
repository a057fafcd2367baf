"""Browser tier: the real server on a free port (a subprocess), driven by Debian's Chromium
through Python Playwright. Never `playwright install`: the browser is /usr/bin/chromium.

    python scripts/build_web.py                 # uPlot into web/static/vendor/ (once)
    .venv/bin/pytest -m browser tests/browser   # these tests

Without Chromium or Playwright the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.lab import free_port

CHROMIUM = os.environ.get("CRASHDRILL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
PRESETS = Path(__file__).with_name("presets")
REPO = Path(__file__).resolve().parents[2]
VENDOR_JS = REPO / "web" / "static" / "vendor" / "uPlot.iife.min.js"
START_TIMEOUT_S = 30


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must install it: see .ci/run)")
    pytest.skip(what)


@dataclass
class LabServer:
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> LabServer:
    """`crashdrill serve` on a free port; fails with the server's output when it does
    not answer within START_TIMEOUT_S."""
    port = free_port()
    log = data_dir / "serve.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "CRASHDRILL_PRESETS_DIR": str(PRESETS), **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "crashdrill",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--max-concurrent",
        "2",
        "--stop-runs-on-exit",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    server = LabServer(f"http://127.0.0.1:{port}", data_dir, proc, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{server.output()}")
        try:
            with urllib.request.urlopen(server.url + "/api/presets", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.2)
    stop_server(server)
    pytest.fail(f"the server did not answer within {START_TIMEOUT_S} s:\n{server.output()}")


def stop_server(server: LabServer) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(5)


def serve_lab(
    tmp_path_factory: pytest.TempPathFactory, name: str, token: str | None = None
) -> Iterator[LabServer]:
    """A lab of its own for a test module (data dir `name`), with instructor mode on when
    `token` is given; stopped when the module is done. `yield from` it in a fixture."""
    env = {"CRASHDRILL_INSTRUCTOR_TOKEN": token} if token else None
    server = start_server(tmp_path_factory.mktemp(name), env=env)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "lab")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        _missing(f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Python Playwright is not installed (.venv/bin/pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser: Any, *, console: bool = True) -> Any:
    """A page in a fresh browser context (own cookie = own session) at laptop size; page
    errors, and with `console` the console's errors too, are collected in page.errors.
    Close it with page.context.close()."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    if console:
        pg.on(
            "console",
            lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
        )
    pg.errors = errors
    return pg


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[object]:
    """open_page's page, closed after the test."""
    pg = open_page(browser)
    yield pg
    pg.context.close()


@pytest.fixture(scope="session")
def vendor_built() -> None:
    if not VENDOR_JS.exists():
        pytest.fail("uPlot is not in web/static/vendor/: run `python scripts/build_web.py` first")
