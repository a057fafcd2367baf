"""The ingest loop: reads the runs' records files into the database and pushes what is new.

    ingest = IngestLoop(settings, store, fanout, outage, mirror, supervisors)
    ingest.start()             # on the event loop: a task that passes every ingest_interval_s
    ingest.tail(run_id)        # read this run's files from now on
    ...
    await ingest.stop()        # the task ends (a pass still on its thread finishes)
    await ingest.last_pass()   # once more over every tailed run (at shutdown)
    await ingest.close()       # after this no pass touches the database

A pass runs on a worker thread: against a remote Postgres every statement costs a
network round trip, which on the event loop's thread would stall every request and stream
meanwhile. The loop only snapshots what to do (`PassJob`), then publishes what the pass
built (`PassResult`), in order. Records go out at once; a run's view and its resume checks
at most every THROTTLE_S while it trains.

`lock` holds one pass at a time, on any thread, and keeps the database open while held
(`closed` is set under it): whoever else stores what a run's files say (the supervisors'
reports) takes it too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashdrill.server.background import BackgroundTask
from crashdrill.server.ingest import IngestBatch, ingest_mirror_log, ingest_run
from crashdrill.server.lessons.crash_effects import started_over_events
from crashdrill.server.lessons.resume_checks import checks_from_rows
from crashdrill.server.outage import Outage
from crashdrill.server.settings import Settings
from crashdrill.server.start_times import StartTimes
from crashdrill.server.storage.db import DatabaseUnavailable, Row
from crashdrill.server.storage.store import TERMINAL_STATES, RunState, Store, state_rank
from crashdrill.server.stream.fanout import Fanout, Message
from crashdrill.server.views import queue_positions, record_json, run_view
from crashdrill.trainer.resume_compare import COMPARED_KINDS
from crashdrill.trainer.run_files import MIRROR_LOG, RECORDS_FILE
from crashdrill.workers.mirror import CheckpointMirror

log = logging.getLogger(__name__)

# While a run trains, its state and resume checks are pushed at most this often (the
# records themselves go out at once); a change of state goes out at once.
THROTTLE_S = 0.5
BACKOFF_S = (0.25, 5.0)  # retries while the database is unreachable: first, longest


@dataclass(frozen=True)
class PassJob:
    """What one ingest pass does, snapshotted on the loop."""

    tails: list[str]  # runs whose files are read
    supervised: frozenset[str]  # runs with a trainer still watched
    runs_due: list[str]  # runs whose view is pushed now
    checks_due: list[str]  # runs whose resume checks are pushed now


@dataclass
class PassResult:
    """What one ingest pass built, for the loop to publish and note."""

    messages: list[tuple[str, Message]] = field(default_factory=list)
    runs_due: list[str] = field(default_factory=list)  # views to push within THROTTLE_S
    checks_due: list[str] = field(default_factory=list)
    untail: list[str] = field(default_factory=list)  # runs whose files are read to the end
    stepped: list[str] = field(default_factory=list)  # runs with new step records stored
    more: bool = False  # some file has more to read
    error: DatabaseUnavailable | None = None  # the database failed partway


@dataclass
class Tailed:
    """What the ingest passes know of a run they read (their thread's alone)."""

    run_dir: Path
    mirror_offset: int = 0  # bytes of mirror.jsonl ingested
    # The sizes of records.jsonl and mirror.jsonl when a pass last read both to the end:
    # while they stay so and its trainer is watched the run costs no database round trip.
    read_to: tuple[int, int] | None = None


def _file_sizes(run_dir: Path) -> tuple[int, int]:
    """Sizes of records.jsonl and mirror.jsonl in `run_dir` (-1: not there)."""
    sizes = []
    for name in (RECORDS_FILE, MIRROR_LOG):
        try:
            sizes.append((run_dir / name).stat().st_size)
        except OSError:
            sizes.append(-1)
    return sizes[0], sizes[1]


def view_message(
    row: Row,
    pair: Row,
    positions: dict[str, int],
    waits: Mapping[str, float | None] | None = None,
) -> Message:
    """The `run` message: the run's view, as GET /api/pairs/{pair} shows it."""
    data = json.dumps(run_view(row, pair, positions, waits), separators=(",", ":"))
    return Message(event="run", key=f"run:{row['id']}", data=data, rank=state_rank(row["state"]))


def run_message(store: Store, run_id: str) -> Message | None:
    """The run's view as the `run` message (reads the database; any thread)."""
    row = store.run(run_id)
    pair = store.pair(row["pair_id"]) if row else None
    if row is None or pair is None:
        return None
    queued = row["state"] == RunState.QUEUED
    positions = queue_positions(store.runs_in([RunState.QUEUED])) if queued else {}
    return view_message(row, pair, positions)


def resume_checks(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's resume checks as GET /api/runs/{run}/resume-checks shows them."""
    # Every kind whose deterministic fields a resume must reproduce (step, val, probe, sample)
    records = [row for kind in COMPARED_KINDS for row in store.records_of_kind(run_id, kind)]
    resumes = store.records_of_kind(run_id, "resume")
    return [c.to_dict() for c in checks_from_rows(records, resumes)]


class IngestLoop:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        fanout: Fanout,
        outage: Outage,
        mirror: CheckpointMirror | None,
        supervised: Mapping[str, object],
        start_times: StartTimes | None = None,
    ) -> None:
        """`start_times`: fed the start figure of each step record stored that has one."""
        self.settings = settings
        self.start_times = start_times
        self.store = store
        self.fanout = fanout
        self.outage = outage
        self.mirror = mirror
        self._supervised = supervised  # the lab's watched runs (read on the loop)
        self.lock = threading.Lock()  # one pass at a time; the database open while held
        self.closed = False  # the database is closed (set under `lock`)
        self._tails: set[str] = set()  # runs whose records.jsonl is being ingested
        self._tailed: dict[str, Tailed] = {}  # the passes' own, per run read
        # The passes' own: each run's newest record id published (a records message's
        # `after`, so a page sees any hole its stream skipped; unknown before the first).
        self._newest_id: dict[str, int] = {}
        self._checks_due: dict[str, float] = {}
        self._runs_due: dict[str, float] = {}
        self._task = BackgroundTask("crashdrill-ingest", log)
        # On the loop, for each run a pass stored step records of: a crash test armed for
        # its first step lands (server/run_control.py, fire_first_step_kill).
        self.on_step: Callable[[str], None] | None = None

    # ---- on the loop ----------------------------------------------------------------

    def start(self) -> None:
        self._task.start(self._loop())

    async def stop(self) -> None:
        await self._task.stop()

    async def last_pass(self) -> None:
        """One more pass over every tailed run, every push due now (at shutdown)."""
        self._apply_pass(await asyncio.to_thread(self._run_pass, self._next_pass(False)))

    async def close(self) -> None:
        """No pass touches the database after this (one still on its thread ends first)."""
        await asyncio.to_thread(self.lock.acquire)
        self.closed = True
        self.lock.release()

    def tail(self, run_id: str) -> None:
        """Read the run's files from the next pass on, until they are read to the end
        after it ended."""
        self._tails.add(run_id)

    def checks_due_now(self, run_id: str) -> None:
        """Push the run's resume checks with the next pass (it ended)."""
        self._checks_due[run_id] = 0.0

    def view_pushed(self, run_id: str) -> None:
        """Its view just went out: no throttled push of it is due."""
        self._runs_due.pop(run_id, None)

    def publish_run(self, run_id: str) -> None:
        """Push the run's view now (reads the database on this thread)."""
        self.view_pushed(run_id)
        message = run_message(self.store, run_id)
        if message is not None:
            self.fanout.publish(f"run:{run_id}", message)

    async def _loop(self) -> None:
        interval = self.settings.ingest_interval_s
        backoff = BACKOFF_S[0]
        while True:
            delay = interval
            try:
                job = self._next_pass()
                result = await asyncio.to_thread(self._run_pass, job)
                self._apply_pass(result)
                if result.error is None:
                    self.outage.ok()
                    backoff = BACKOFF_S[0]
                    delay = 0 if result.more else interval
                else:
                    self.outage.failed(result.error)
                    delay, backoff = backoff, min(backoff * 2, BACKOFF_S[1])
            except Exception:
                log.exception("ingest failed; retrying in %.0f s", BACKOFF_S[1])
                delay = BACKOFF_S[1]
            await asyncio.sleep(delay)

    def _next_pass(self, due_only: bool = True) -> PassJob:
        """On the loop: the runs to tail and the pushes that are due, taken off the lists."""
        now = time.monotonic()
        runs_due = [r for r, due in self._runs_due.items() if due <= now or not due_only]
        checks_due = [r for r, due in self._checks_due.items() if due <= now or not due_only]
        for run_id in runs_due:
            del self._runs_due[run_id]
        for run_id in checks_due:
            del self._checks_due[run_id]
        return PassJob(list(self._tails), frozenset(self._supervised), runs_due, checks_due)

    def _apply_pass(self, result: PassResult) -> None:
        """On the loop: publish the pass's messages in order, note the pushes it made due."""
        for channel, message in result.messages:
            self.fanout.publish(channel, message)
        now = time.monotonic()
        for run_id in result.checks_due:
            self._checks_due.setdefault(run_id, now + THROTTLE_S)
        for run_id in result.runs_due:
            self._runs_due.setdefault(run_id, now + THROTTLE_S)
        for run_id in result.untail:
            self._tails.discard(run_id)
        if self.on_step is not None:
            for run_id in dict.fromkeys(result.stepped):
                try:
                    self.on_step(run_id)
                except Exception:  # a database outage: the next step record tries again
                    log.exception("the step hook of run %s failed", run_id)

    # ---- on a worker thread ---------------------------------------------------------

    def _run_pass(self, job: PassJob) -> PassResult:
        """Reads the files and the database, writes the database, builds the messages;
        touches no state of the loop's (the one pass at a time holds `lock`)."""
        result = PassResult()
        with self.lock:
            if self.closed:
                return result
            try:
                self._pass_body(job, result)
            except DatabaseUnavailable as e:
                # What was built so far went to the database: it is still published. The
                # due pushes not made go back on the list (the loop puts them back).
                result.error = e
                result.runs_due += job.runs_due
                result.checks_due += job.checks_due
        return result

    def _pass_body(self, job: PassJob, result: PassResult) -> None:
        """The pass itself; raises DatabaseUnavailable where the database failed."""
        todo: list[tuple[str, tuple[int, int] | None]] = []
        for run_id in job.tails:
            known = self._tailed.get(run_id)
            sizes = _file_sizes(known.run_dir) if known is not None else None
            if run_id in job.supervised and sizes and known and known.read_to == sizes:
                continue  # nothing written since the last pass read it all
            todo.append((run_id, sizes))
        rows = self.store.runs_by_id([run_id for run_id, _ in todo]) if todo else {}
        for run_id, sizes in todo:
            row = rows.get(run_id)
            if row is None:
                result.untail.append(run_id)
                self._tailed.pop(run_id, None)
                self._newest_id.pop(run_id, None)
                continue
            tailed = self._tailed.setdefault(run_id, Tailed(Path(row["run_dir"])))
            # Asked before reading mirror.jsonl: once not busy, its last line is written.
            copying = self.mirror is not None and self.mirror.busy(Path(row["run_dir"]).name)
            batch = ingest_run(self.store, row)
            if batch is not None:
                self._batch_messages(batch, result)
            mirrored = self._ingest_mirror_log(tailed, row, result)
            more = (batch is not None and batch.more) or mirrored
            result.more = result.more or more
            tailed.read_to = None if more else sizes  # the sizes taken before reading
            done = row["state"] in TERMINAL_STATES and run_id not in job.supervised
            if done and not copying and not more:
                result.untail.append(run_id)
                del self._tailed[run_id]
                self._newest_id.pop(run_id, None)
        for run_id in job.runs_due:
            message = run_message(self.store, run_id)
            if message is not None:
                result.messages.append((f"run:{run_id}", message))
        for run_id in job.checks_due:
            payload = {"run": run_id, "checks": resume_checks(self.store, run_id)}
            data = json.dumps(payload, separators=(",", ":"))
            message = Message(event="resume_checks", key=f"checks:{run_id}", data=data)
            result.messages.append((f"run:{run_id}", message))

    def read_rest(self, row: Row) -> list[tuple[str, Message]]:
        """Store the rest of an ended run's records file and mirror.jsonl now; the
        messages to push. The caller holds `lock` (the supervisors' reports: a run said to
        have ended has every record it and its checkpoint mirror wrote stored first)."""
        ended = PassResult()
        fresh: Row | None = row
        while fresh is not None and (batch := ingest_run(self.store, fresh)) is not None:
            self._batch_messages(batch, ended)
            fresh = self.store.run(row["id"]) if batch.more else None
        tailed = self._tailed.setdefault(row["id"], Tailed(Path(row["run_dir"])))
        while self._ingest_mirror_log(tailed, row, ended):
            pass
        tailed.read_to = None  # the next pass looks at both files again
        return ended.messages

    def _ingest_mirror_log(self, tailed: Tailed, row: Row, result: PassResult) -> bool:
        """Ingest what the mirror's thread appended to DIR/mirror.jsonl (its events and
        `mirror` records); True when the file has more to read."""
        offset = tailed.mirror_offset
        try:
            size = (Path(row["run_dir"]) / MIRROR_LOG).stat().st_size
        except OSError:
            return False
        if size <= offset:
            return False
        fresh = self.store.run(row["id"])  # ingest_run may have moved its offset and summary
        if fresh is None:
            return False
        batch, tailed.mirror_offset = ingest_mirror_log(self.store, fresh, offset)
        if batch is None:
            return False
        self._batch_messages(batch, result)
        return batch.more

    def _batch_messages(self, batch: IngestBatch, result: PassResult) -> None:
        run_id = batch.run_id
        batch.inserted.extend(started_over_events(self.store, batch))
        if "step" in batch.kinds:
            result.stepped.append(run_id)
        if self.start_times is not None and "step" in batch.kinds:
            for _, rec in batch.inserted:
                self.start_times.note_record(rec)
        if batch.inserted:
            items = [record_json(rid, run_id, rec.data) for rid, rec in batch.inserted]
            after = self._newest_id.get(run_id)
            self._newest_id[run_id] = max(rid for rid, _ in batch.inserted)
            message = Message(
                event="records",
                key=f"records:{run_id}",
                mode="append",
                items=items,
                run=run_id,
                last_id=batch.inserted[-1][0],
                after_id=after,
            )
            result.messages.append((f"run:{run_id}", message))
        if batch.resume_segments or "resume" in batch.kinds:
            result.checks_due.append(run_id)
        # An event may change what the view reads beside the records (a lost rank's
        # survivors now waiting: its `ranks`, server/rank_view.py).
        if batch.run_fields.keys() & {"stage", "step"} or "event" in batch.kinds:
            result.runs_due.append(run_id)
