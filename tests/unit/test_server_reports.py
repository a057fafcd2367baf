"""Supervisors' reports applied to the database: a run said to have ended has every record
stored first, the checkpoint mirror's copy of its last checkpoint included."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from crashdrill.server.ingest_loop import IngestLoop
from crashdrill.server.outage import Outage
from crashdrill.server.reports import SupervisorReports
from crashdrill.server.settings import Settings
from crashdrill.server.storage.db import Database
from crashdrill.server.storage.store import Store
from crashdrill.server.stream.fanout import LocalFanout
from crashdrill.workers.launch import Change
from crashdrill.workers.mirror import CheckpointMirror
from tests.support.gcs_emulator import write_checkpoint, write_run_json
from tests.support.rows import present

pytestmark = pytest.mark.timeout(60)

UPLOAD_S = 0.6  # each file of the copy takes this long: the trainer has long exited


class SlowPuts:
    """A mirror backend whose uploads take UPLOAD_S each (a slow bucket)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url

    def put(self, name: str, src: IO[bytes], size: int) -> None:
        time.sleep(UPLOAD_S)
        self.inner.put(name, src, size)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    db = Database(tmp_path / "lab.sqlite3")
    db.migrate()
    s = Store(db)
    run_dir = tmp_path / "runs" / "r1"
    s.create_pair("p1", "owner", "quick", {"knob": {}}, [("r1", "A", str(run_dir))])
    write_run_json(run_dir, keep=2, mirror="on")
    yield s
    db.close()


def trainer_finished(run_dir: Path, step: int) -> None:
    """What the trainer leaves at its end: its last checkpoint and records."""
    write_checkpoint(run_dir, step)
    lines = [
        {"kind": "step", "step": step, "loss": 1.0, "loss_bits": 1065353216},
        {"kind": "ckpt", "step": step, "bytes": 12288, "seconds": 0.01, "path": "ckpt"},
        {"kind": "stage", "stage": "finished", "progress": 1.0},
    ]
    text = "".join(json.dumps({"v": 1, "t": time.time(), "segment": 0, **r}) + "\n" for r in lines)
    (run_dir / "records.jsonl").write_text(text)


async def report_and_wait(reports: SupervisorReports, store: Store, change: Change) -> None:
    reports.start()
    try:
        reports.callback("r1")(change)
        deadline = time.monotonic() + 20
        while present(store.run("r1"), "run r1")["state"] != change.state:
            assert time.monotonic() < deadline, "the report was never applied"
            await asyncio.sleep(0.01)
    finally:
        await reports.stop()


def test_a_finished_run_has_its_last_mirror_copy_stored_before_it_reads_finished(
    store: Store, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "r1"
    mirror = CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02)
    mirror.backend = SlowPuts(mirror.backend)
    mirror.watch(run_dir)
    mirror.start()
    settings = Settings(data_dir=tmp_path / "lab", telemetry=False)
    outage = Outage(logging.getLogger(__name__))
    fanout = LocalFanout()
    ingest = IngestLoop(settings, store, fanout, outage, mirror, {})

    def on_ended(run_id: str, row: Any) -> None:
        mirror.release(run_id)  # as the lab does once the end is stored

    reports = SupervisorReports(store, ingest, fanout, outage, on_ended, mirror)
    try:
        trainer_finished(run_dir, 300)
        asyncio.run(report_and_wait(reports, store, Change("finished", exit_code=0)))
        # Read the moment the state says finished: every record is in.
        mirrored = [r["step"] for r in store.records_of_kind("r1", "mirror")]
        events = [json.loads(r["data"]) for r in store.records_of_kind("r1", "event")]
    finally:
        mirror.stop()
    assert mirrored == [300]
    assert [e["code"] for e in events] == ["mirror"]
    assert [r["step"] for r in store.records_of_kind("r1", "step")] == [300]


def test_a_failing_mirror_does_not_hold_a_run_s_end(store: Store, tmp_path: Path) -> None:
    class Unreachable(SlowPuts):
        def put(self, name: str, src: IO[bytes], size: int) -> None:
            from crashdrill.workers.mirror_backends import MirrorError

            raise MirrorError("network: cannot reach the bucket")

    run_dir = tmp_path / "runs" / "r1"
    mirror = CheckpointMirror(str(tmp_path / "mirror"), poll_s=0.02, backoff_s=(30.0, 60.0))
    mirror.backend = Unreachable(mirror.backend)
    mirror.watch(run_dir)
    mirror.start()
    settings = Settings(data_dir=tmp_path / "lab", telemetry=False)
    outage = Outage(logging.getLogger(__name__))
    ingest = IngestLoop(settings, store, LocalFanout(), outage, mirror, {})
    reports = SupervisorReports(store, ingest, LocalFanout(), outage, lambda r, row: None, mirror)
    try:
        trainer_finished(run_dir, 300)
        # Ends within report_and_wait's 20 s: the retry, 30 s on, is not waited for.
        asyncio.run(report_and_wait(reports, store, Change("finished", exit_code=0)))
        events = [json.loads(r["data"]) for r in store.records_of_kind("r1", "event")]
    finally:
        mirror.stop()
    assert [e["code"] for e in events] == ["mirror_failed"]  # the failure is in, and said
