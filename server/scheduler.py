"""The queue: which queued runs start, and when.

    scheduler = Scheduler(settings, store, fanout, outage, build, started)
    scheduler.start()      # on the event loop: the scheduler task
    scheduler.schedule()   # from any thread: a pass soon (a pair was created, a run ended)
    await scheduler.stop() # no new starts from now on

At most as many runs as the machine carries are starting/running/restarting (the
lab's Admission, server/admission.py: measured each pass from the runs' pace, never more
than `max_concurrent`); the rest wait in FIFO order, a pair's two runs together. On a Ray
cluster with no `max_concurrent` given, every queued run starts at once and waits for a
node with the resources its preset needs: the queue and the limit are then the cluster's
(its log says what it waits for).

A pass's database work (the queue, marking runs starting, every queued run's new place
and its estimated wait, server/queue_wait.py) runs on a worker thread: a remote
database's round trips would stall the loop, and a long queue means a view to push for
each run. The wait is estimated once a pass, for all queued runs together; while runs
wait, a pass also runs every ESTIMATE_EVERY_S to push a fresher estimate.
A queued run is taken with UPDATE … WHERE the state is still queued, so a run a Stop click stopped
while a pass planned it is not started anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.server.admission import Admission
from crashdrill.server.background import BackgroundTask, on_signal
from crashdrill.server.ingest_loop import view_message
from crashdrill.server.outage import Outage
from crashdrill.server.queue_wait import QueueWaits, queue_waits, run_work
from crashdrill.server.settings import Settings
from crashdrill.server.start_times import StartTimes
from crashdrill.server.storage.db import DatabaseUnavailable, Row
from crashdrill.server.storage.store import ACTIVE_STATES, RunState, Store
from crashdrill.server.stream.fanout import Fanout, Message
from crashdrill.server.views import queue_positions
from crashdrill.trainer.stages import Stage
from crashdrill.workers.supervisor import Supervisor

log = logging.getLogger(__name__)

# While runs wait, a pass this often besides: the runs ahead measured their pace since,
# and the queued runs' views get a fresher estimate of their wait.
ESTIMATE_EVERY_S = 5.0


@dataclass
class StartPlan:
    """What a scheduling pass starts (supervisors built, not started) and pushes."""

    starts: list[tuple[str, Supervisor]] = field(default_factory=list)
    messages: list[tuple[str, Message]] = field(default_factory=list)
    queued: int = 0  # runs still waiting after it


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        fanout: Fanout,
        outage: Outage,
        build: Callable[[Row, Row | None], Supervisor],
        started: Callable[[str, Supervisor], None],
        start_times: StartTimes | None = None,
        admission: Admission | None = None,
    ) -> None:
        """`build(run, pair)`: a run's supervisor, not started (on a worker thread);
        `started(run_id, supervisor)`: on the loop, to watch it and start it;
        `start_times`: how long starts take here (a queued run's wait includes one);
        `admission`: how many runs at once (default: from `settings`)."""
        self.settings = settings
        self.start_times = start_times
        self.admission = admission or Admission.from_settings(settings)
        self.waits = QueueWaits()  # each queued run's estimated wait, from the newest pass
        self.store = store
        self.fanout = fanout
        self.outage = outage
        self._build = build
        self._started = started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wanted = asyncio.Event()
        self._task = BackgroundTask("crashdrill-schedule", log)
        self._closing = False  # no new starts while stopping
        self._planning = threading.Lock()  # held by a pass's database work (its thread)
        self._refresh: asyncio.TimerHandle | None = None  # the next pass while runs wait

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task.start(on_signal(self._wanted, self._schedule_once))

    async def stop(self) -> None:
        """No new starts from now on; the task ends, and a pass's database work still on
        its thread (a cancelled task does not stop it) has ended too: runs it marked
        starting and never handed to `started` are the caller's to stop or leave."""
        self._closing = True
        if self._refresh is not None:
            self._refresh.cancel()
        await self._task.stop()
        await asyncio.to_thread(self._planning.acquire)
        self._planning.release()

    def schedule(self) -> None:
        """Ask for a scheduling pass (from any thread); the scheduler task runs it soon."""
        loop = self._loop
        if self._closing or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._wanted.set)

    async def _schedule_once(self) -> bool:
        """Start queued runs while slots are free: FIFO, a pair's runs together."""
        if self._closing:
            return True
        try:
            plan = await asyncio.to_thread(self._plan_starts)
        except DatabaseUnavailable as e:
            self.outage.failed(e)
            return False
        except Exception:
            log.exception("scheduling failed; trying again")
            return False
        for run_id, sup in plan.starts:
            if self._closing:  # marked starting: the next server start resumes it
                break
            self._started(run_id, sup)
        for channel, message in plan.messages:
            self.fanout.publish(channel, message)
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        if plan.queued and self._loop is not None:
            self._refresh = self._loop.call_later(ESTIMATE_EVERY_S, self._wanted.set)
        return True

    def _plan_starts(self) -> StartPlan:
        """On a worker thread: which queued runs start now (marked 'starting', their
        supervisors built, not started), and the views to push (theirs, and every queued
        run's new place in the queue)."""
        with self._planning:
            return self._plan_starts_locked()

    def _plan_starts_locked(self) -> StartPlan:
        plan = StartPlan()
        if self._closing:
            return plan
        queued = self.store.runs_in([RunState.QUEUED])
        if not queued:
            self.waits.set({}, time.time())
            return plan
        active_rows = self.store.runs_in(ACTIVE_STATES)
        active = len(active_rows)
        paces = [run_work(r, None) for r in active_rows]
        limit = self.admission.limit(paces, self.start_times)
        if limit is None:  # on a cluster: each run starts and waits for a node of its own
            limit = active + len(queued)
        free = limit - active
        started: list[Row] = []
        while queued and free > 0:
            group = [r for r in queued if r["pair_id"] == queued[0]["pair_id"]]
            if free < min(len(group), limit):
                break
            for row in group[:free]:
                if self._closing:  # the lab stops: it marks nothing starting from here on
                    break
                queued.remove(row)
                fields = {
                    "state": RunState.STARTING,
                    "stage": Stage.STARTING,
                    "started_at": time.time(),
                }
                if not self.store.update_run_if(row["id"], RunState.QUEUED, **fields):
                    continue  # stopped meanwhile
                Path(row["run_dir"]).mkdir(parents=True, exist_ok=True)
                started.append({**row, **fields})
                free -= 1
        pair_ids = {r["pair_id"] for r in started + queued}
        if queued:  # the estimate needs the active runs' lengths too
            pair_ids |= {r["pair_id"] for r in active_rows}
        pairs = self.store.pairs_by_id(list(pair_ids))
        for row in started:
            plan.starts.append((row["id"], self._build(row, pairs.get(row["pair_id"]))))
        positions = queue_positions(queued)
        plan.queued = len(queued)
        waits = self._estimate(active_rows + started, queued, pairs, limit)
        for row in started + queued:
            pair = pairs.get(row["pair_id"])
            if pair is not None:
                message = view_message(row, pair, positions, waits)
                plan.messages.append((f"run:{row['id']}", message))
        return plan

    def _estimate(
        self, active: list[Row], queued: list[Row], pairs: dict[str, Row], limit: int
    ) -> dict[str, float | None]:
        """Each queued run's wait, once for the pass (server/queue_wait.py), with the runs
        at once this pass admitted (`limit`); kept for the views that requests build until
        the next pass."""
        if not queued:
            self.waits.set({}, time.time())
            return {}
        startup = self.start_times.summary()["median_s"] if self.start_times else None
        waits = queue_waits(
            [run_work(r, pairs.get(r["pair_id"])) for r in active],
            [run_work(r, pairs.get(r["pair_id"])) for r in queued],
            None if self.settings.max_concurrent is None else limit,
            startup,
        )
        self.waits.set(waits, time.time())
        return waits
