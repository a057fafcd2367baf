"""An in-process Cloud Storage emulator (gcp-storage-emulator) for the mirror tests, and a
writer of checkpoint directories in the trainer's format (without torch)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.extras import require_extra
from tests.support.lab import free_port

__all__ = ["BUCKET", "free_port", "gcs_emulator", "write_checkpoint", "write_run_json"]

BUCKET = "crashdrill-test"


@contextmanager
def gcs_emulator(port: int | None = None, bucket: str = BUCKET) -> Iterator[str]:
    """Serve an empty in-memory emulator with `bucket`; yields its http://host:port. What
    talks to it is google-cloud-storage: without the gcs extra the test skips (or fails
    under CI=true, tests/support/extras.py)."""
    require_extra("gcs")
    from gcp_storage_emulator.server import create_server

    port = port or free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def write_checkpoint(
    run_dir: Path,
    step: int,
    *,
    size: int = 4096,
    created: float | None = None,
) -> Path:
    """`run_dir/ckpt/step-N/` as the trainer writes it: three files, then MANIFEST.json
    with each file's sha256 and size."""
    path = Path(run_dir) / "ckpt" / f"step-{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    for name in ("model.pt", "optimizer.pt", "train_state.pt"):
        data = os.urandom(size)
        (path / name).write_bytes(data)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest = {
        "format": 1,
        "step": step,
        "files": files,
        "created": created if created is not None else time.time(),
        "parts": ["weights", "optimizer", "schedule", "rng", "data"],
    }
    (path / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return path


def write_run_json(run_dir: Path, **config: Any) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    info = {"pid": 0, "starts": 1, "label": "A", "preset": "quick", "config": config}
    (Path(run_dir) / "run.json").write_text(json.dumps(info))
