"""Ingest of a run's records.jsonl into the database, from the offset saved last time.

The file is the source of truth. Each call reads the complete lines after the saved
byte offset, inserts them and moves the offset in one transaction, so a server killed at
any moment re-reads at most what it had not committed, and duplicate rows are refused by
their key: (segment, step, kind) for step-bearing kinds, the line's byte offset for the
others (events, stages, resumes…). A final line without its newline (a trainer killed
mid-write) is left for later; a line that is not a JSON object, or whose step, segment,
time or text does not fit its column, is skipped and counted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashdrill.server.run_paths import RunPaths
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import NewRecord, Store
from crashdrill.trainer.record_contract import STATE_KINDS, STEP_KEYED_KINDS, finite_or_null
from crashdrill.trainer.run_files import (
    MIRROR_LOG,
    RECORDS_FILE,
    complete_part,
    read_complete_lines,
)
from crashdrill.trainer.stages import AFTER_TRAINING, Stage

log = logging.getLogger(__name__)

# From the run-record contract: kinds stored once per (segment, step), and kinds whose
# newest record the run row keeps in `latest_json`.
LATEST_KINDS = frozenset(STATE_KINDS)
CHUNK_BYTES = 1 << 20
INT64 = (-(2**63), 2**63 - 1)  # BIGINT in Postgres, INTEGER in SQLite


@dataclass(frozen=True)
class Parsed:
    record: NewRecord
    value: dict[str, Any]


@dataclass
class IngestBatch:
    """What one ingest call added for one run."""

    run_id: str
    inserted: list[tuple[int, NewRecord]]
    run_fields: dict[str, Any]
    more: bool  # the file has more bytes than this call read
    bad_lines: int = 0
    kinds: set[str] = field(default_factory=set)
    resume_segments: bool = False  # step rows of a segment ≥ 1 arrived


def parse_lines(
    chunk: bytes, base_offset: int, key_prefix: str = "", paths: RunPaths | None = None
) -> tuple[list[Parsed], int, int]:
    """Records in the complete lines of `chunk`, read at byte `base_offset` of the file.

    With `key_prefix` (a file other than records.jsonl) every record is keyed by that
    prefix and its byte offset. Returns (records, bytes consumed up to and including the
    last newline, bad lines). With `paths`, every string is stored run-relative
    (server/run_paths.py).
    """
    part = complete_part(chunk, base_offset)
    parsed: list[Parsed] = []
    bad = 0
    for offset, line in part.lines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            bad += 1
            continue
        if not _storable(value):
            bad += 1
            continue
        value = finite_or_null(value)  # a bare NaN or Infinity token: null (record_contract)
        if paths is not None:
            value = paths.value(value)
        kind = value["kind"]
        segment = value.get("segment")
        if not isinstance(segment, int) or isinstance(segment, bool) or segment < 0:
            segment = 0
        step = value.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = None
        t = value.get("t")
        t = None if isinstance(t, bool) or not isinstance(t, int | float) else float(t)
        if key_prefix:
            key = f"{key_prefix}@{offset}"
        elif kind in STEP_KEYED_KINDS and step is not None:
            key = f"{segment}:{step}:{kind}"
        else:
            key = f"@{offset}"
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        parsed.append(Parsed(NewRecord(key, segment, kind, step, t, text), value))
    return parsed, len(part.data), bad


def _storable(value: dict[str, Any]) -> bool:
    """Whether the fields that go to columns fit them: integers in 64 bits, numbers in a
    double, text without a lone UTF-16 surrogate (neither SQLite nor Postgres stores one).
    A line that does not fit is skipped as bad: inserting it would fail the same way on
    every ingest pass and stop the run's records for good."""
    for name in ("kind", "stage"):
        text = value.get(name)
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return False
    for name in ("segment", "step"):
        n = value.get(name)
        if isinstance(n, int) and not isinstance(n, bool) and not INT64[0] <= n <= INT64[1]:
            return False
    for name in ("t", "progress"):
        x = value.get(name)
        if isinstance(x, int) and not isinstance(x, bool):
            try:
                float(x)
            except OverflowError:
                return False
    return True


def run_fields_after(run: Row, values: list[dict[str, Any]]) -> dict[str, Any]:
    """The run row's summary columns once `values` (in file order) are applied.

    The stage follows the file: a supervisor's restart event (an event with
    `resume_from`, docs/run-contract.md) makes it `restarting` — so does a crash test, at
    once (server/run_control.py) — and from then on only the next segment's trainer moves
    it on: a stage record of the trainer that was killed, stored late, does not say
    `train` again (the crash test's check, views.training, reads it)."""
    latest = json.loads(run.get("latest_json") or "{}")
    fields: dict[str, Any] = {}
    segment = run.get("segment") or 0
    # The segment whose trainer is gone, while the stage says restarting.
    gone = segment if run.get("stage") == Stage.RESTARTING else None
    for value in values:
        kind = value["kind"]
        seg = value.get("segment")
        if isinstance(seg, int):
            segment = max(segment, seg)
        if kind == "stage" and isinstance(value.get("stage"), str):
            newer = gone is None or (isinstance(seg, int) and seg > gone)
            if newer or value["stage"] in AFTER_TRAINING:
                gone = None
                fields["stage"] = value["stage"]
                progress = value.get("progress")
                fields["stage_progress"] = progress if isinstance(progress, int | float) else None
        elif kind == "event" and "resume_from" in value and isinstance(seg, int):
            gone = seg if gone is None else max(gone, seg)
            fields["stage"] = Stage.RESTARTING
            fields["stage_progress"] = None
        elif kind == "step" and isinstance(value.get("step"), int):
            fields["step"] = value["step"]
        if kind in LATEST_KINDS:
            latest[kind] = value
    fields["segment"] = segment
    fields["latest_json"] = json.dumps(latest, separators=(",", ":"))
    return fields


def _store_parsed(
    store: Store, run: Row, parsed: list[Parsed], ingest_offset: int, *, more: bool, bad: int
) -> IngestBatch:
    """Insert `parsed` for `run` with its summary columns and its saved ingest offset
    (`ingest_offset`) in one transaction; `more` and `bad` are reported in the batch."""
    values = [p.value for p in parsed]
    fields = run_fields_after(run, values) if values else {}
    inserted = store.insert_records(run["id"], [p.record for p in parsed], ingest_offset, fields)
    return IngestBatch(
        run_id=run["id"],
        inserted=inserted,
        run_fields=fields,
        more=more,
        bad_lines=bad,
        kinds={rec.kind for _, rec in inserted},
    )


def ingest_run(store: Store, run: Row, chunk_bytes: int = CHUNK_BYTES) -> IngestBatch | None:
    """Read and store what the run's records.jsonl gained since the saved offset."""
    path = Path(run["run_dir"]) / RECORDS_FILE
    offset = int(run["ingest_offset"])
    part = read_complete_lines(path, offset, chunk_bytes)
    size = part.size
    if size <= offset:  # no file (-1), or nothing new
        if 0 <= size < offset:
            log.warning("%s shrank below the ingest offset %d; ignored", path, offset)
        return None
    parsed, consumed, bad = parse_lines(part.data, offset, paths=RunPaths(run["run_dir"]))
    if consumed == 0:
        if part.read >= chunk_bytes:  # one line longer than a whole chunk: skip it
            log.warning("%s: a line over %d bytes at offset %d skipped", path, chunk_bytes, offset)
            store.update_run(run["id"], ingest_offset=offset + part.read)
        return None
    if bad:
        log.warning(
            "%s: %d line(s) skipped: not records, or values no database column holds", path, bad
        )
    batch = _store_parsed(
        store, run, parsed, offset + consumed, more=offset + consumed < size, bad=bad
    )
    batch.resume_segments = any(rec.kind == "step" and rec.segment > 0 for _, rec in batch.inserted)
    return batch


def ingest_mirror_log(
    store: Store, run: Row, offset: int, chunk_bytes: int = CHUNK_BYTES
) -> tuple[IngestBatch | None, int]:
    """Read what the run's mirror.jsonl (written by the checkpoint mirror's thread, see
    workers/mirror.py) gained after `offset`; returns the batch and the new offset.

    The offset lives in the server's memory only: after a restart the file is read from
    0 again, and its lines, keyed "mirror@OFFSET", are not stored twice. `run` must be
    the current row (its ingest offset and summary are written back unchanged).
    """
    path = Path(run["run_dir"]) / MIRROR_LOG
    part = read_complete_lines(path, offset, chunk_bytes)
    size = part.size
    if size < 0:
        return None, 0
    if size <= offset:
        return None, min(offset, size)
    parsed, consumed, bad = parse_lines(
        part.data, offset, key_prefix="mirror", paths=RunPaths(run["run_dir"])
    )
    if consumed == 0:
        return None, offset
    batch = _store_parsed(
        store, run, parsed, int(run["ingest_offset"]), more=offset + consumed < size, bad=bad
    )
    return batch, offset + consumed
