"""Housekeeping for a lab that a class shares: pairs nobody watches are stopped, and the
checkpoints of finished runs go when they are old or the lab's disk budget is spent.

    keeper = Housekeeping(settings, store, fanout, mirror, stop_pair)
    keeper.seen(pair_id)     # someone polled the pair (GET /api/pairs/{pair}, a stream's start)
    keeper.start()           # on the event loop: a pass every housekeeping_interval_s
    keeper.pass_once()       # one pass's database and disk work (on a worker thread)
    keeper.disk_free()       # free bytes where the runs live (new pairs get 503 below a floor)
    await keeper.stop()

Watching. A pair counts as watched while an event stream of it is open or since its last
poll; one that nobody watched for `idle_stop_s` (0: never) has its queued and active runs
stopped, "Stopped by the lab: nobody watched this pair for 30 min". After a server start
every pair gets a fresh `idle_stop_s`. With Supabase Realtime on, the pages follow
Broadcast instead of the lab, which then cannot see who watches: idle stops are off.

Disk. A run's records stay for good; its checkpoints (DIR/ckpt/ and its copies in the
mirror) are deleted `checkpoint_retention_s` (0: never) after it ended, and sooner, oldest
ended first, while the checkpoints the lab keeps on its disk add up to more than
`disk_budget_bytes` (0: no budget). Only runs that have ended are touched, and only once
their last checkpoint is no longer on its way to the mirror: nothing a running run (or a
resume of it) needs is ever deleted. A run whose checkpoints went has `ckpt_deleted_at`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crashdrill.server.background import BackgroundTask, every
from crashdrill.server.settings import Settings
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import ACTIVE_STATES, LIVE_STATES, Store
from crashdrill.server.stream.fanout import Fanout
from crashdrill.trainer.checkpoint_layout import ckpt_root
from crashdrill.workers.mirror import CheckpointMirror
from crashdrill.workers.mirror_backends import MirrorError
from crashdrill.workers.mirror_layout import delete_copies, mirror_key

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    """What one pass did (tests and the log read it)."""

    idle_stopped: list[str] = field(default_factory=list)  # pair ids to stop
    expired: list[str] = field(default_factory=list)  # run ids whose checkpoints went (age)
    over_budget: list[str] = field(default_factory=list)  # ... went for the disk budget
    checkpoint_bytes: int = 0  # what the lab keeps on its disk after the pass


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds < 7200 else f"{seconds / 3600:g} h"


class Housekeeping:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        fanout: Fanout,
        mirror: CheckpointMirror | None,
        stop_pair: Callable[[str, str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`stop_pair(pair_id, who)` stops the pair's live runs ("Stopped by WHO.")."""
        self.settings = settings
        self.store = store
        self.fanout = fanout
        self.mirror = mirror
        self._stop_pair = stop_pair
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._since = clock()  # a pair polled before this server started counts from here
        self._task = BackgroundTask("crashdrill-housekeeping", log)
        self.last: PassReport | None = None

    # ---- watching -------------------------------------------------------------------

    def seen(self, pair_id: str) -> None:
        """Someone looked at the pair (any thread)."""
        with self._lock:
            self._seen[pair_id] = self._clock()

    @property
    def idle_stops(self) -> bool:
        return self.settings.idle_stop_s > 0 and not self.settings.realtime

    def _watched_at(self, pair: Row, runs: list[Row]) -> float:
        with self._lock:
            polled = self._seen.get(pair["id"], 0.0)
        if any(self.fanout.has_subscribers(f"run:{r['id']}") for r in runs):
            return self._clock()
        return max(polled, self._since, float(pair["created_at"]))

    # ---- the task -------------------------------------------------------------------

    def start(self) -> None:
        failed = "housekeeping failed; trying again in the next pass"
        self._task.start(every(self.settings.housekeeping_interval_s, self._pass, log, failed))

    async def stop(self) -> None:
        await self._task.stop()

    async def _pass(self) -> None:
        self.last = await asyncio.to_thread(self.pass_once)
        for pair_id in self.last.idle_stopped:  # on the loop: stopping pushes views
            self._stop_pair(pair_id, self.idle_who())

    def idle_who(self) -> str:
        return f"the lab: nobody watched this pair for {minutes(self.settings.idle_stop_s)}"

    def pass_once(self) -> PassReport:
        """The pairs to stop (the caller stops them on the loop) and the disk's cleanup."""
        report = PassReport()
        if self.idle_stops:
            self._stop_idle(report)
        self._clean_disk(report)
        return report

    # ---- idle pairs -----------------------------------------------------------------

    def _stop_idle(self, report: PassReport) -> None:
        limit = self.settings.idle_stop_s
        live = self.store.runs_in(LIVE_STATES)
        by_pair: dict[str, list[Row]] = {}
        for run in live:
            by_pair.setdefault(run["pair_id"], []).append(run)
        pairs = self.store.pairs_by_id(list(by_pair))
        now = self._clock()
        for pair_id, runs in by_pair.items():
            pair = pairs.get(pair_id)
            if pair is None or now - self._watched_at(pair, runs) <= limit:
                continue
            log.info("stopping pair %s: nobody watched it for %s", pair_id, minutes(limit))
            report.idle_stopped.append(pair_id)

    # ---- disk -----------------------------------------------------------------------

    def disk_free(self) -> int:
        """Free bytes on the file system of the runs' directory."""
        path = self.settings.runs_dir
        while not path.exists() and path != path.parent:
            path = path.parent
        return shutil.disk_usage(path).free

    def _local_mirror(self, run: Row) -> Path | None:
        """The run's copies in a mirror on this machine's disk (counted in the budget)."""
        if self.mirror is None or self.mirror.off_machine:
            return None
        return Path(self.mirror.url) / mirror_key(run["run_dir"])

    def _bytes_of(self, run: Row) -> int:
        local = tree_bytes(ckpt_root(run["run_dir"]))
        mirrored = self._local_mirror(run)
        return local + (tree_bytes(mirrored) if mirrored is not None else 0)

    def _clean_disk(self, report: PassReport) -> None:
        retention = self.settings.checkpoint_retention_s
        budget = self.settings.disk_budget_bytes
        if not retention and not budget:
            return
        ended = self.store.ended_runs_with_checkpoints()  # oldest ended first
        now = self._clock()
        keep: list[tuple[Row, int]] = []
        for run in ended:
            expired = retention and now - float(run["ended_at"] or now) > retention
            if expired and self._delete_checkpoints(run):
                report.expired.append(run["id"])
                continue
            keep.append((run, self._bytes_of(run) if budget else 0))
        if not budget:
            return
        live = sum(self._bytes_of(r) for r in self.store.runs_in(ACTIVE_STATES))
        total = live + sum(size for _, size in keep)
        for run, size in keep:
            if total <= budget:
                break
            if self._delete_checkpoints(run):
                report.over_budget.append(run["id"])
                total -= size
        report.checkpoint_bytes = total
        if total > budget:
            log.warning(
                "the lab keeps %d bytes of checkpoints, over its disk budget of %d"
                " (disk_budget_bytes): the rest belong to runs that are still training",
                total,
                budget,
            )

    def _delete_checkpoints(self, run: Row) -> bool:
        """Delete an ended run's checkpoints, here and in the mirror; False while its last
        one may still be on its way to the mirror (the next pass tries again)."""
        run_id = run["id"]
        now = self.store.run(run_id)
        if now is None or now["state"] in LIVE_STATES:
            return False  # resumed meanwhile? never delete what a live run needs
        key = mirror_key(run["run_dir"])
        if self.mirror is not None and self.mirror.busy(key):
            return False
        shutil.rmtree(ckpt_root(run["run_dir"]), ignore_errors=True)
        if self.mirror is not None:
            try:
                delete_copies(self.mirror.backend, key)
            except MirrorError as e:
                log.warning("could not delete run %s's copies in the mirror: %s", run_id, e)
                return False
        self.store.update_run(run_id, ckpt_deleted_at=self._clock())
        return True
