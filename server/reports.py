"""Supervisors' reports (a run is running, restarting, or ended) applied to the database
and pushed, in the order they came.

    reports = SupervisorReports(store, ingest, fanout, outage, ended, mirror)
    reports.start()                               # on the event loop: the change task
    Supervisor(launch, reports.callback(run_id))  # supervisors report from their threads
    await reports.stop()                          # the task ends; the queue stays
    await reports.apply()                         # what is queued, in order (at shutdown)

Supervisors watch trainers in their own threads and report through
`call_soon_threadsafe`. One task applies the reports in order, each one's database work
on a worker thread (a run's start, end or crash costs a few round trips). While the
database is unreachable they wait in order: a run that ended meanwhile must not stay
'running' for good. A run that ended has the rest of its records stored before its state
says so: whoever sees it finished can read every record it wrote, and the checkpoint
mirror's records of its end too. So a report that a run ended waits (up to
LAST_COPY_WAIT_S; the reports of other runs go on meanwhile, a run's own stay in order)
until the mirror has copied, or tried to copy, the run's last checkpoint; then both files
are read to the end and the state is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from crashdrill.server.background import BackgroundTask, on_signal
from crashdrill.server.ingest_loop import IngestLoop, run_message
from crashdrill.server.outage import Outage
from crashdrill.server.storage.db import DatabaseUnavailable, Row
from crashdrill.server.storage.store import TERMINAL_STATES, RunState, Store
from crashdrill.server.stream.fanout import Fanout, Message
from crashdrill.workers.launch import Change
from crashdrill.workers.mirror import CheckpointMirror

log = logging.getLogger(__name__)

# How long a run's end waits for the mirror's copy of its last checkpoint. A copy that
# takes longer (a slow bucket) lands in the run's records after its end; one that failed
# does not hold the end at all (its failure is logged, the copy retried in the background).
LAST_COPY_WAIT_S = 30.0
LAST_COPY_POLL_S = 0.05


class SupervisorReports:
    def __init__(
        self,
        store: Store,
        ingest: IngestLoop,
        fanout: Fanout,
        outage: Outage,
        ended: Callable[[str, Row], None],
        mirror: CheckpointMirror | None = None,
    ) -> None:
        """`ended(run_id, row)`: on the loop, once a run's end is stored (`row`: the run
        as it was before). `mirror`: the lab's checkpoint mirror, whose last copy of an
        ended run is waited for."""
        self.store = store
        self.mirror = mirror
        self._last_copy: dict[str, float] = {}  # ended runs whose last copy is awaited: since
        self.ingest = ingest
        self.fanout = fanout
        self.outage = outage
        self._ended = ended
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changes: deque[tuple[str, Change]] = deque()  # in the order they came
        self._wanted = asyncio.Event()
        self._task = BackgroundTask("crashdrill-changes", log)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task.start(on_signal(self._wanted, self.apply))

    async def stop(self) -> None:
        """The task ends; reports still queued wait for `apply`."""
        await self._task.stop()

    def callback(self, run_id: str) -> Callable[[Change], None]:
        """What a run's supervisor calls, from its thread, with each change."""
        return functools.partial(self._report_threadsafe, run_id)

    def _report_threadsafe(self, run_id: str, change: Change) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._queue, run_id, change)

    def _queue(self, run_id: str, change: Change) -> None:
        self._changes.append((run_id, change))
        self._wanted.set()

    async def apply(self, *, last_copies: bool = True) -> bool:
        """Apply the queued reports in order; False when the database failed (the rest
        wait). The database work on a worker thread, the lab's own state on the loop. A
        run's end waits for the mirror's last copy (`last_copies`; not at shutdown, where
        the mirror stops): it and that run's later reports stay queued, the others go on."""
        held: set[str] = set()
        i = 0
        while i < len(self._changes) and not self.ingest.closed:
            run_id, change = self._changes[i]
            if run_id in held or (last_copies and not self._last_copy_done(run_id, change)):
                held.add(run_id)
                i += 1
                continue
            try:
                stored = await asyncio.to_thread(self.store_change, run_id, change)
            except DatabaseUnavailable as e:
                self.outage.failed(e)
                return False
            except Exception:
                log.exception("applying %s of run %s failed; skipped", change.state, run_id)
                stored = None
            del self._changes[i]
            if stored is None:
                continue
            row, messages = stored
            if change.state in TERMINAL_STATES:
                self._ended(run_id, row)
            self.ingest.view_pushed(run_id)
            for channel, message in messages:
                self.fanout.publish(channel, message)
        if held and self._loop is not None:
            self._loop.call_later(LAST_COPY_POLL_S, self._wanted.set)
        return True

    def _last_copy_done(self, run_id: str, change: Change) -> bool:
        """False while an ended run's last checkpoint is still on its way to the mirror
        (released here, so the copy starts now), for at most LAST_COPY_WAIT_S."""
        if self.mirror is None or change.state not in TERMINAL_STATES:
            return True
        key = run_id  # a lab run's key in the mirror: its run dir's name, the run's id
        since = self._last_copy.get(run_id)
        if since is None:  # once: each release wakes the mirror's scan, which hashes files
            since = self._last_copy[run_id] = time.monotonic()
            self.mirror.release(key)
        if self.mirror.settled(key) or time.monotonic() - since > LAST_COPY_WAIT_S:
            self._last_copy.pop(run_id, None)
            return True
        return False

    def store_change(
        self, run_id: str, change: Change
    ) -> tuple[Row, list[tuple[str, Message]]] | None:
        """On a worker thread: the report into the run's row; the row as it was, and the
        messages to push (None: no such run, or the database closed)."""
        with self.ingest.lock:  # the database stays open; no ingest pass meanwhile
            if self.ingest.closed:
                return None
            messages: list[tuple[str, Message]] = []
            row = self.store.run(run_id)
            if row is None:
                return None
            if change.state == RunState.RUNNING:
                self.store.update_run(
                    run_id, state=RunState.RUNNING, pid=change.pid, pid_started=change.pid_started
                )
            elif change.state == RunState.RESTARTING:
                # The supervisor appended its restart event before this report: stored
                # now, it sets the stage in the file's order (server/ingest.py), so a
                # report applied after the new trainer's first records does not undo them.
                messages = self.ingest.read_rest(row)
                self.store.update_run(run_id, state=RunState.RESTARTING, pid=None)
            else:
                messages = self.ingest.read_rest(row)
                fields: dict[str, Any] = {
                    "state": change.state,
                    "ended_at": time.time(),
                    "pid": None,
                    "exit_code": change.exit_code,
                    "message": change.text or None,
                    "detail": change.detail or None,  # the instructor's class view only
                }
                if change.state in (RunState.STOPPED, RunState.DIVERGED):
                    fields["stage"] = change.state
                self.store.update_run(run_id, **fields)
            view = run_message(self.store, run_id)
            return row, [*messages, *([(f"run:{run_id}", view)] if view else [])]
