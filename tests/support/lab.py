"""Shared pieces of the server tests: a free loopback port, the stand-in trainer's
command, and the real app served by uvicorn in a thread."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STAND_IN = (sys.executable, str(Path(__file__).resolve().parent / "stand_in_trainer.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(settings: object, start_timeout: float = 30) -> Iterator[str]:
    """`create_app(settings)` on 127.0.0.1:settings.port until the block ends."""
    import uvicorn

    from crashdrill.server.app import create_app

    port = settings.port  # type: ignore[attr-defined]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    config.timeout_graceful_shutdown = 2
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
