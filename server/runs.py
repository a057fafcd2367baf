"""The lab: pairs of runs, their lifecycle, the queue, ingest and what is pushed live.

Everything here runs on the event loop's thread, except the database work of the ingest
passes (`_run_pass`) and of scheduling (`_plan_starts`), and `create_pair` and the
read-only requests, which run on worker threads (a remote Postgres's round trips would
stall the loop). Supervisors watch trainers in their own threads and report through
`call_soon_threadsafe`; so does the telemetry sampler.

Lifecycle of a run (`state`): queued → starting → running ⇄ restarting → finished |
failed | stopped. At most `max_concurrent` runs are starting/running/restarting; the rest
wait in FIFO order, a pair's two runs together.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashdrill.server.crash_modes import crash_mode, launch_env, started_over_events
from crashdrill.server.db import Database, DatabaseUnavailable, Outage, Row, open_database
from crashdrill.server.errors import BadInput, Conflict, Forbidden, NotFound, TooMany
from crashdrill.server.fanout import Fanout, LocalFanout, Message
from crashdrill.server.ingest import IngestBatch, ingest_mirror_log, ingest_run
from crashdrill.server.lesson_policy import public_view
from crashdrill.server.realtime import realtime_fanout
from crashdrill.server.resume_check import checks_from_rows
from crashdrill.server.settings import Settings, SettingsError, lock_data_dir
from crashdrill.server.store import ACTIVE_STATES, TERMINAL_STATES, Store
from crashdrill.server.telemetry_feed import Sampler, TelemetryFeed, default_sampler
from crashdrill.server.views import pair_view, queue_positions, record_json, run_view
from crashdrill.trainer.presets import LABELS, Preset, PresetError, list_presets
from crashdrill.workers.mirror import MIRROR_LOG, CheckpointMirror
from crashdrill.workers.mirror_backends import MirrorError
from crashdrill.workers.run_dir import RECORDS, RunDir
from crashdrill.workers.supervisor import Change, Launch, NotRunning, Supervisor

log = logging.getLogger(__name__)

# While a run trains, its state and resume checks are pushed at most this often (the
# records themselves go out at once); a change of state goes out at once.
THROTTLE_S = 0.5
LIVE_STATES = ("queued", *ACTIVE_STATES)
BACKOFF_S = (0.25, 5.0)  # ingest's retries while the database is unreachable: first, longest
RETRY_S = 1.0  # a scheduling pass or a supervisor's report waiting for the database
# A run whose dir holds this file trains that preset text (see create_pair).
FROZEN_PRESET = "preset.toml"


@dataclass
class StartPlan:
    """What a scheduling pass starts (supervisors built, not started) and pushes."""

    starts: list[tuple[str, Supervisor]] = field(default_factory=list)
    messages: list[tuple[str, Message]] = field(default_factory=list)


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
    for name in (RECORDS, MIRROR_LOG):
        try:
            sizes.append((run_dir / name).stat().st_size)
        except OSError:
            sizes.append(-1)
    return sizes[0], sizes[1]


def _view_message(row: Row, pair: Row, positions: dict[str, int]) -> Message:
    """The `run` message: the run's view, as GET /api/pairs/{pair} shows it."""
    data = json.dumps(run_view(row, pair, positions), separators=(",", ":"))
    return Message(event="run", key=f"run:{row['id']}", data=data)


def new_id() -> str:
    """An unguessable id (96 random bits, URL-safe)."""
    return secrets.token_urlsafe(12)


class Lab:
    def __init__(
        self,
        settings: Settings,
        fanout: Fanout | None = None,
        sampler_factory: Callable[[Settings], Sampler | None] = default_sampler,
    ) -> None:
        self.settings = settings
        self.mirror: CheckpointMirror | None = None  # copies checkpoints off the machine
        if settings.mirror_url:
            try:
                self.mirror = CheckpointMirror(settings.mirror_url)
            except MirrorError as e:
                raise SettingsError(f"mirror = {settings.mirror!r}: {e}") from None
        self._tailed: dict[str, Tailed] = {}  # the ingest passes' own, per run read
        # Supabase Realtime when configured (SSE stays on beside it), else SSE alone.
        fanout = fanout or realtime_fanout(settings, self._pair_of_run, self._live_pairs)
        self._lock_fd = lock_data_dir(settings.data_dir)
        try:
            self.db: Database = open_database(settings)  # SQLite, or Postgres by URL
        except BaseException:
            os.close(self._lock_fd)
            raise
        try:
            self.db.migrate()
            self.store = Store(self.db, settings.resolve_lab_id())
            claimed = self.store.claim_unowned()
        except BaseException:
            self.db.close()
            os.close(self._lock_fd)
            raise
        if claimed:
            log.info("%d run(s) from before schema 2 now belong to this lab", claimed)
        self.fanout: Fanout = fanout or LocalFanout(settings.stream_max_pending_records)
        self.telemetry = TelemetryFeed(settings, self.store, self.fanout, sampler_factory)
        self.supervisors: dict[str, Supervisor] = {}
        self._tails: set[str] = set()  # runs whose records.jsonl is being ingested
        self._checks_due: dict[str, float] = {}
        self._runs_due: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # no new starts while stopping
        self._closed = False  # the database is closed: late reports are dropped
        self._ingest_lock = threading.Lock()  # one ingest pass at a time, on any thread
        self.outage = Outage(log)  # the database unreachable: said once, and its end
        self._changes: deque[tuple[str, Change]] = deque()  # supervisors' reports, in order
        self._changes_wanted = asyncio.Event()
        self._changer: asyncio.Task[None] | None = None
        self._schedule_wanted = asyncio.Event()
        self._create_lock = threading.Lock()  # create_pair runs on request threads
        self._scheduler: asyncio.Task[None] | None = None

    # ---- start and stop -------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._recover()
        self._task = asyncio.create_task(self._ingest_loop(), name="crashdrill-ingest")
        self._scheduler = asyncio.create_task(
            self._on_signal(self._schedule_wanted, self._schedule_once), name="crashdrill-schedule"
        )
        self._changer = asyncio.create_task(
            self._on_signal(self._changes_wanted, self._apply_changes), name="crashdrill-changes"
        )
        if self.mirror is not None:
            self.mirror.start()
        self.fanout.start()
        self.telemetry.start(self._loop)
        self.schedule()

    async def stop(self) -> None:
        self._closing = True
        self.telemetry.stop()
        for task in (self._task, self._scheduler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        sups = list(self.supervisors.values())
        for sup in sups:
            if self.settings.stop_runs_on_exit:
                sup.stop("the server shutting down")
            else:
                sup.detach()
        if self.settings.stop_runs_on_exit:
            await asyncio.to_thread(lambda: [s.join(10) for s in sups])
            for _ in range(3):
                await asyncio.sleep(0)  # let the supervisors' last reports land
        if self._changer is not None:
            self._changer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._changer
        if self.settings.stop_runs_on_exit:
            await self._apply_changes()  # the runs' last states, in order
            self._apply_pass(await asyncio.to_thread(self._run_pass, self._next_pass(False)))
        elif sups:
            log.info("%d run(s) keep training; the next server start adopts them", len(sups))
        if self.mirror is not None:
            # A copy in flight is abandoned (no manifest: it does not count); the next
            # start watches the runs again and copies their newest checkpoints.
            await asyncio.to_thread(self.mirror.stop)
        self.fanout.close()
        # A pass whose task was cancelled may still be on its thread: let it end first.
        await asyncio.to_thread(self._ingest_lock.acquire)
        self._closed = True
        self._ingest_lock.release()
        self.db.close()
        os.close(self._lock_fd)

    def _recover(self) -> None:
        """After a restart: adopt live trainers, resume dead ones, continue ingest."""
        for row in self.store.runs_in(ACTIVE_STATES):
            rd = RunDir(Path(row["run_dir"]))
            sup = self._supervisor(row)
            self._tails.add(row["id"])
            if sup.adopt([row["pid"], rd.run_json().get("pid")]):
                log.info("adopted the live trainer of run %s", row["id"])
                self.supervisors[row["id"]] = sup
                continue
            _, _, stage = rd.last_seen()
            if stage in ("finished", "failed"):
                self.store.update_run(row["id"], state=stage, ended_at=time.time(), pid=None)
                self._release_mirror(row)
                continue
            log.info("resuming run %s, whose trainer died while the server was down", row["id"])
            self.supervisors[row["id"]] = sup
            sup.resume("The trainer stopped while the lab server was down")
        for row in self.store.runs_in(TERMINAL_STATES):
            path = RunDir(Path(row["run_dir"])).records
            if path.exists() and path.stat().st_size > row["ingest_offset"]:
                self._tails.add(row["id"])
            elif (Path(row["run_dir"]) / MIRROR_LOG).exists():
                self._tails.add(row["id"])  # mirror.jsonl's offset is not kept: read it again

    def _pair_of_run(self, run_id: str) -> str | None:
        row = self.store.run(run_id)
        return row["pair_id"] if row else None

    def _live_pairs(self) -> list[str]:
        """Pairs with a run queued or active (for Realtime: telemetry, keepalives)."""
        return list(dict.fromkeys(r["pair_id"] for r in self.store.runs_in(LIVE_STATES)))

    def _supervisor(self, row: Row, pair: Row | None = None) -> Supervisor:
        """The run's supervisor, not started (any thread; `pair`: its pair row, else read)."""
        if self.mirror is not None:
            self.mirror.watch(Path(row["run_dir"]))
        frozen = Path(row["run_dir"]) / FROZEN_PRESET
        preset_ref = str(frozen) if frozen.is_file() else row["preset"]
        mode = crash_mode(pair or self.store.pair(row["pair_id"]))
        launch = Launch(
            run_dir=Path(row["run_dir"]),
            preset=preset_ref,
            label=row["label"],
            command=self.settings.trainer_command,
            env=launch_env(preset_ref, row["label"], mode),
        )
        return Supervisor(
            launch,
            functools.partial(self._on_change_threadsafe, row["id"]),
            mirror=self.settings.mirror_url,
        )

    def _release_mirror(self, row: Row) -> None:
        """The run ended: its last checkpoint still goes to the mirror, then it is dropped."""
        if self.mirror is not None:
            self.mirror.release(Path(row["run_dir"]).name)

    # ---- requests -------------------------------------------------------------------

    def create_pair(
        self,
        preset_name: str,
        owner: str,
        instructor: bool = False,
        *,
        preset: Preset | None = None,
        public: dict[str, Any] | None = None,
        frozen_text: str | None = None,
    ) -> dict[str, Any]:
        """`preset` (already resolved by the caller) or the built-in named `preset_name`.
        `frozen_text`: the preset as TOML, written to each run dir as FROZEN_PRESET and
        trained from there (instructor presets, a student's settings)."""
        if preset is None:
            try:
                presets = {p.id: p for p in list_presets()}
            except PresetError as e:
                raise BadInput(f"the lesson presets cannot be read: {e}") from None
            found = presets.get(preset_name)
            if found is None:
                known = ", ".join(sorted(presets))
                raise NotFound(f"unknown preset {preset_name!r}; known presets: {known}")
            preset = found
        with self._create_lock:  # the limits and the insert, one request at a time
            return self._create_pair(preset, preset_name, owner, instructor, public, frozen_text)

    def _create_pair(
        self,
        preset: Preset,
        preset_name: str,
        owner: str,
        instructor: bool,
        public: dict[str, Any] | None,
        frozen_text: str | None,
    ) -> dict[str, Any]:
        if not instructor:
            mine = self.store.active_pairs_of(owner)
            if mine >= self.settings.max_pairs_per_session:
                raise TooMany(
                    f"this browser already has {mine} pairs queued or training (the limit is"
                    f" {self.settings.max_pairs_per_session}): stop one or let it finish"
                )
        if len(self.store.runs_in(["queued"])) + len(LABELS) > self.settings.max_queued_runs:
            raise TooMany("the lab's queue is full: try again when some runs have finished")
        pair_id = new_id()
        runs = [(new_id(), label) for label in LABELS]
        # The frozen text first: the scheduler (its own thread) may start a run as soon
        # as its row exists, and must find the text it trains.
        if frozen_text is not None:
            for rid, _ in runs:
                (self.settings.runs_dir / rid).mkdir(parents=True, exist_ok=True)
                (self.settings.runs_dir / rid / FROZEN_PRESET).write_text(frozen_text, "utf-8")
        try:
            self.store.create_pair(
                pair_id,
                owner,
                preset.id,
                public or public_view(preset),
                [(rid, label, str(self.settings.runs_dir / rid)) for rid, label in runs],
            )
        except BaseException:
            for rid, _ in runs:
                shutil.rmtree(self.settings.runs_dir / rid, ignore_errors=True)
            raise
        self.schedule()
        return {"pair": pair_id, "runs": [{"id": rid, "label": label} for rid, label in runs]}

    def pair(self, pair_id: str, session: str) -> dict[str, Any]:
        pair = self.store.pair(pair_id)
        if pair is None:
            raise NotFound(f"no pair {pair_id!r}")
        positions = queue_positions(self.store.runs_in(["queued"]))
        runs = self.store.runs_of_pair(pair_id)
        return pair_view(pair, runs, positions, is_owner=pair["owner"] == session)

    def run_row(self, run_id: str) -> Row:
        row = self.store.run(run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        return row

    def check_may_control(self, run_id: str, session: str, instructor: bool) -> Row:
        row = self.run_row(run_id)
        if not instructor and self.store.owner_of_run(run_id) != session:
            raise Forbidden(
                "this run belongs to another browser: only its owner or an instructor"
                " may crash or stop it"
            )
        return row

    def crash(self, run_id: str, session: str, instructor: bool) -> dict[str, Any]:
        row = self.check_may_control(run_id, session, instructor)
        state, stage = row["state"], row["stage"]
        if state != "running" or stage != "train":
            why = {
                "queued": "it is still queued",
                "starting": "it is still starting",
                "restarting": "it is resuming after a crash",
                "running": f"it is in stage {stage!r}, not training yet",
            }.get(state, f"it has {state}")
            raise Conflict(f"cannot crash run {run_id}: {why}; crash tests hit training runs")
        sup = self.supervisors.get(run_id)
        if sup is None:
            raise Conflict(f"cannot crash run {run_id}: no trainer process is watched")
        mode = crash_mode(self.store.pair(row["pair_id"]))
        try:
            pid = sup.crash(mode)
        except NotRunning as e:
            raise Conflict(f"cannot crash run {run_id}: {e}") from None
        self.store.update_run(
            run_id, state="restarting", stage="restarting", crashes=row["crashes"] + 1
        )
        self._publish_run(run_id)
        return {
            "run": run_id,
            "killed_pid": pid,
            "at_step": row["step"],
            "state": "restarting",
            "crash_mode": mode,
        }

    def stop_run(self, run_id: str, session: str, instructor: bool) -> dict[str, Any]:
        row = self.check_may_control(run_id, session, instructor)
        who = (
            "an instructor"
            if instructor and self.store.owner_of_run(run_id) != session
            else "its owner"
        )
        if row["state"] == "queued":
            if not self.store.update_run_if(
                run_id,
                "queued",
                state="stopped",
                ended_at=time.time(),
                message=f"Stopped by {who}.",
            ):
                raise Conflict(f"cannot stop run {run_id}: it is starting; try again in a moment")
            self.schedule()
        elif row["state"] in ACTIVE_STATES and run_id in self.supervisors:
            self.supervisors[run_id].stop(who)
        else:
            raise Conflict(f"cannot stop run {run_id}: it has {row['state']}")
        self._publish_run(run_id)
        return {"run": run_id, "state": self.run_row(run_id)["state"], "stopping": True}

    # ---- the queue ------------------------------------------------------------------

    def schedule(self) -> None:
        """Ask for a scheduling pass (from any thread); the scheduler task runs it soon."""
        loop = self._loop
        if self._closing or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._schedule_wanted.set)

    @staticmethod
    async def _on_signal(wanted: asyncio.Event, work: Callable[[], Awaitable[bool]]) -> None:
        """Run `work` whenever `wanted` is set, one at a time; when it fails (False), again
        after RETRY_S (the scheduler and the change task)."""
        while True:
            await wanted.wait()
            wanted.clear()
            if not await work():
                await asyncio.sleep(RETRY_S)
                wanted.set()

    async def _schedule_once(self) -> bool:
        """Start queued runs while slots are free: FIFO, a pair's runs together. The
        database work on a worker thread (a remote database's round trips would stall
        the loop, and a long queue means a view to push for each run)."""
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
            self.supervisors[run_id] = sup
            self._tails.add(run_id)
            sup.start()
        for channel, message in plan.messages:
            self.fanout.publish(channel, message)
        return True

    def _plan_starts(self) -> StartPlan:
        """On a worker thread: which queued runs start now (marked 'starting', their
        supervisors built, not started), and the views to push (theirs, and every queued
        run's new place in the queue)."""
        plan = StartPlan()
        limit = self.settings.max_concurrent
        free = limit - len(self.store.runs_in(ACTIVE_STATES))
        queued = self.store.runs_in(["queued"])
        if not queued:
            return plan
        started: list[Row] = []
        while queued and free > 0:
            group = [r for r in queued if r["pair_id"] == queued[0]["pair_id"]]
            if free < min(len(group), limit):
                break
            for row in group[:free]:
                queued.remove(row)
                fields = {"state": "starting", "stage": "starting", "started_at": time.time()}
                if not self.store.update_run_if(row["id"], "queued", **fields):
                    continue  # stopped meanwhile
                Path(row["run_dir"]).mkdir(parents=True, exist_ok=True)
                started.append({**row, **fields})
                free -= 1
        pairs = self.store.pairs_by_id(list({r["pair_id"] for r in started + queued}))
        for row in started:
            plan.starts.append((row["id"], self._supervisor(row, pairs.get(row["pair_id"]))))
        positions = queue_positions(queued)
        for row in started + queued:
            pair = pairs.get(row["pair_id"])
            if pair is not None:
                plan.messages.append((f"run:{row['id']}", _view_message(row, pair, positions)))
        return plan

    # ---- reports from supervisor threads --------------------------------------------

    def _on_change_threadsafe(self, run_id: str, change: Change) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._queue_change, run_id, change)

    def _queue_change(self, run_id: str, change: Change) -> None:
        """Supervisors' reports are applied in order by the change task; while the
        database is unreachable they wait (a run that ended meanwhile must not stay
        'running' for good)."""
        self._changes.append((run_id, change))
        self._changes_wanted.set()

    async def _apply_changes(self) -> bool:
        """Apply the queued reports in order; False when the database failed (the rest
        wait). The database work on a worker thread, the lab's own state on the loop."""
        while self._changes and not self._closed:
            run_id, change = self._changes[0]
            try:
                stored = await asyncio.to_thread(self._store_change, run_id, change)
            except DatabaseUnavailable as e:
                self.outage.failed(e)
                return False
            except Exception:
                log.exception("applying %s of run %s failed; skipped", change.state, run_id)
                stored = None
            self._changes.popleft()
            if stored is None:
                continue
            row, messages = stored
            if change.state not in ("running", "restarting"):
                self.supervisors.pop(run_id, None)
                self._release_mirror(row)
                self._checks_due[run_id] = 0.0
                self.schedule()
            self._runs_due.pop(run_id, None)
            for channel, message in messages:
                self.fanout.publish(channel, message)
        return True

    def _store_change(
        self, run_id: str, change: Change
    ) -> tuple[Row, list[tuple[str, Message]]] | None:
        """On a worker thread: the report into the run's row; the row as it was, and the
        messages to push (None: no such run, or the database closed). A run that ended
        has the rest of its records file stored first: whoever sees it finished can read
        every record it wrote."""
        with self._ingest_lock:  # the database stays open; no ingest pass meanwhile
            if self._closed:
                return None
            messages: list[tuple[str, Message]] = []
            row = self.store.run(run_id)
            if row is None:
                return None
            if change.state == "running":
                self.store.update_run(
                    run_id, state="running", pid=change.pid, pid_started=change.pid_started
                )
            elif change.state == "restarting":
                self.store.update_run(run_id, state="restarting", stage="restarting", pid=None)
            else:
                ended = PassResult()
                fresh: Row | None = row
                while fresh is not None and (batch := ingest_run(self.store, fresh)) is not None:
                    self._batch_messages(batch, ended)
                    fresh = self.store.run(run_id) if batch.more else None
                messages = ended.messages
                fields: dict[str, Any] = {
                    "state": change.state,
                    "ended_at": time.time(),
                    "pid": None,
                    "exit_code": change.exit_code,
                    "message": change.text or None,
                }
                if change.state == "stopped":
                    fields["stage"] = "stopped"
                self.store.update_run(run_id, **fields)
            view = self._run_message(run_id)
            return row, [*messages, *([(f"run:{run_id}", view)] if view else [])]

    # ---- ingest and publishing ------------------------------------------------------

    async def _ingest_loop(self) -> None:
        """Ingest and the throttled pushes, with their database work on a worker thread:
        against a remote Postgres every statement costs a network round trip, which on
        the event loop's thread would stall every request and stream meanwhile. The
        loop only snapshots what to do, then publishes what the pass built, in order."""
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

    def ingest_once(self) -> bool:
        """One pass over the runs being tailed, all on this thread (at shutdown and in
        tests); True when some file has more to read."""
        result = self._run_pass(self._next_pass(due_only=False))
        self._apply_pass(result)
        return result.more

    def _next_pass(self, due_only: bool = True) -> PassJob:
        """On the loop: the runs to tail and the pushes that are due, taken off the lists."""
        now = time.monotonic()
        runs_due = [r for r, due in self._runs_due.items() if due <= now or not due_only]
        checks_due = [r for r, due in self._checks_due.items() if due <= now or not due_only]
        for run_id in runs_due:
            del self._runs_due[run_id]
        for run_id in checks_due:
            del self._checks_due[run_id]
        return PassJob(list(self._tails), frozenset(self.supervisors), runs_due, checks_due)

    def _run_pass(self, job: PassJob) -> PassResult:
        """Reads the files and the database, writes the database, builds the messages;
        touches no state of the loop's (the one pass at a time holds `_ingest_lock`)."""
        result = PassResult()
        with self._ingest_lock:
            if self._closed:
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
        for run_id in job.runs_due:
            message = self._run_message(run_id)
            if message is not None:
                result.messages.append((f"run:{run_id}", message))
        for run_id in job.checks_due:
            payload = {"run": run_id, "checks": self.resume_checks(run_id)}
            data = json.dumps(payload, separators=(",", ":"))
            message = Message(event="resume_checks", key=f"checks:{run_id}", data=data)
            result.messages.append((f"run:{run_id}", message))

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
        if batch.inserted:
            items = [record_json(rid, run_id, rec.data) for rid, rec in batch.inserted]
            message = Message(
                event="records",
                key=f"records:{run_id}",
                mode="append",
                items=items,
                run=run_id,
                last_id=batch.inserted[-1][0],
            )
            result.messages.append((f"run:{run_id}", message))
        if batch.resume_segments or "resume" in batch.kinds:
            result.checks_due.append(run_id)
        if batch.run_fields.keys() & {"stage", "step"}:
            result.runs_due.append(run_id)

    def _publish_run(self, run_id: str) -> None:
        self._runs_due.pop(run_id, None)
        message = self._run_message(run_id)
        if message is not None:
            self.fanout.publish(f"run:{run_id}", message)

    def _run_message(self, run_id: str) -> Message | None:
        """The run's view as the `run` message (reads the database; any thread)."""
        row = self.store.run(run_id)
        pair = self.store.pair(row["pair_id"]) if row else None
        if row is None or pair is None:
            return None
        positions = (
            queue_positions(self.store.runs_in(["queued"])) if row["state"] == "queued" else {}
        )
        return _view_message(row, pair, positions)

    # ---- reads ----------------------------------------------------------------------

    def resume_checks(self, run_id: str) -> list[dict[str, Any]]:
        steps = self.store.step_losses(run_id)
        resumes = self.store.records_of_kind(run_id, "resume")
        return [c.to_dict() for c in checks_from_rows(steps, resumes)]
