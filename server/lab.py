"""The lab: pairs of runs, their lifecycle, and what students and instructors ask of them.

    lab = Lab(settings)        # opens the database and migrates it; then, on the loop:
    await lab.start()          # adopt or resume the runs of before, start the tasks
    lab.create_pair("quick", owner=session)   # requests (routes call these)
    await lab.stop()           # stop or detach the trainers, store their last records

The lab is the facade over four jobs, one module each: the queue (server/scheduler.py),
the supervisors' reports (server/reports.py), the ingest loop (server/ingest_loop.py) and
this module's requests and recovery after a restart. Requests run on the event loop's
thread, except `create_pair` and the read-only requests, which run on worker threads (a
remote Postgres's round trips would stall the loop). Supervisors watch trainers in their
own threads; so does the telemetry sampler.

Lifecycle of a run (`state`): queued → starting → running ⇄ restarting → finished |
failed | stopped | diverged (its loss turned NaN: trainer/divergence.py; never restarted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashdrill.server.admission import Admission
from crashdrill.server.cluster import executor_for, watch_cluster
from crashdrill.server.door.quotas import check_new_pair
from crashdrill.server.errors import BadInput, NotFound
from crashdrill.server.housekeeping import Housekeeping
from crashdrill.server.ingest_loop import IngestLoop, resume_checks
from crashdrill.server.lessons.bounds import LabLimits, pair_disk_bytes
from crashdrill.server.lessons.catalog import check_corpora
from crashdrill.server.lessons.crash_effects import (
    crash_mode,
    crash_settings,
    fresh_start_allowed,
    launch_env,
    preemption,
)
from crashdrill.server.lessons.policy import public_view
from crashdrill.server.lessons.predictions import prediction_view
from crashdrill.server.outage import Outage
from crashdrill.server.reports import SupervisorReports
from crashdrill.server.run_control import RunControl
from crashdrill.server.scheduler import Scheduler
from crashdrill.server.settings import Settings, SettingsError, lock_data_dir
from crashdrill.server.start_times import StartTimes
from crashdrill.server.storage.db import Database, DatabaseUnavailable, Row, open_database
from crashdrill.server.storage.store import (
    ACTIVE_STATES,
    LIVE_STATES,
    TERMINAL_STATES,
    RunState,
    Store,
)
from crashdrill.server.stream.fanout import Fanout, LocalFanout
from crashdrill.server.stream.realtime import realtime_fanout
from crashdrill.server.stream.telemetry_feed import Sampler, TelemetryFeed, default_sampler
from crashdrill.server.views import pair_view, queue_positions
from crashdrill.trainer.corpus_files import CORPORA_DIR_VARIABLE
from crashdrill.trainer.presets import LABELS, Preset, PresetError, list_presets
from crashdrill.trainer.priority import NICE_VARIABLE
from crashdrill.trainer.run_files import FROZEN_PRESET, MIRROR_LOG
from crashdrill.trainer.stages import AFTER_TRAINING
from crashdrill.workers.graceful_stop import Wall
from crashdrill.workers.launch import Launch
from crashdrill.workers.mirror import CheckpointMirror
from crashdrill.workers.mirror_backends import MirrorError
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.supervisor import Supervisor

log = logging.getLogger(__name__)

# A lab stopping its runs waits this long in all for starts on their way and the
# supervisors' last reports; a run whose start has not ended by then is stored stopped.
STOP_JOIN_S = 30.0


def new_id() -> str:
    """An unguessable id (96 random bits, URL-safe)."""
    return secrets.token_urlsafe(12)


class Lab(RunControl):
    """The lab facade; the requests that signal runs are RunControl's (server/run_control.py)."""

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
        self.executor = executor_for(settings)  # this machine, or a Ray cluster's nodes
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
            self.close()
            raise
        if claimed:
            log.info("%d run(s) from before schema 2 now belong to this lab", claimed)
        self.fanout: Fanout = fanout or LocalFanout(settings.stream_max_pending_records)
        self.telemetry = TelemetryFeed(settings, self.store, self.fanout, sampler_factory)
        watch_cluster(self.executor, self.telemetry, settings)  # nodes' samples, reachability
        self.supervisors: dict[str, Supervisor] = {}  # runs whose trainer is watched
        # The starts on their way (a thread each, `_started`): a stop waits for them, so a
        # run stopped while its trainer was still being started reports it stopped.
        self._starts: dict[str, threading.Thread] = {}
        # Stops asked for while the scheduler was starting a run (state "starting", no
        # supervisor yet): whoever of the Stop and _started comes second carries it out.
        self._stop_when_started: dict[str, str] = {}
        self._first_step_kills: set[str] = set()  # crash tests armed for a first step
        self.outage = Outage(log)  # the database unreachable: said once, and its end
        self.db.reached = self.outage.ok  # whoever reaches it first ends the outage
        # How long trainer starts take here, from the trainers' first step records.
        self.start_times = StartTimes()
        # How many runs train at once: what this machine carries (server/admission.py).
        self.admission = Admission.from_settings(settings)
        if self.admission.warning:
            log.warning("%s", self.admission.warning)
        self.ingest = IngestLoop(
            settings,
            self.store,
            self.fanout,
            self.outage,
            self.mirror,
            self.supervisors,
            self.start_times,
        )
        self.ingest.on_step = self.fire_first_step_kill
        self.scheduler = Scheduler(
            settings,
            self.store,
            self.fanout,
            self.outage,
            self._supervisor,
            self._started,
            self.start_times,
            self.admission,
        )
        self.reports = SupervisorReports(
            self.store, self.ingest, self.fanout, self.outage, self._ended, self.mirror
        )
        self._create_lock = threading.Lock()  # create_pair runs on request threads
        # Idle pairs stopped, old checkpoints deleted (server/housekeeping.py).
        self.housekeeping = Housekeeping(
            settings, self.store, self.fanout, self.mirror, self.stop_pair
        )

    # ---- start and stop -------------------------------------------------------------

    async def start(self) -> None:
        self.executor.open()  # a warm trainer process starts importing torch meanwhile
        self.reports.start()  # first: a trainer adopted or resumed below reports at once
        self._recover()
        self.ingest.start()
        self.scheduler.start()
        if self.mirror is not None:
            self.mirror.start()
        self.fanout.start()
        self.telemetry.start(asyncio.get_running_loop())
        self.housekeeping.start()
        self.schedule()

    async def stop(self) -> None:
        await self.housekeeping.stop()
        await self.scheduler.stop()  # no new starts from here on
        # Runs a pass marked starting but never handed over (the stop came between):
        # stopped with the others below, or resumed by the next server start.
        unstarted: list[str] = []
        if self.settings.stop_runs_on_exit:
            handed = set(self.supervisors)
            try:
                starting = await asyncio.to_thread(self.store.runs_in, [RunState.STARTING])
                unstarted = [r["id"] for r in starting if r["id"] not in handed]
            except DatabaseUnavailable as e:
                self.outage.failed(e)
        self.telemetry.stop()
        await self.ingest.stop()
        sups = list(self.supervisors.values())
        for sup in sups:
            if self.settings.stop_runs_on_exit:
                sup.stop("the server shutting down")
            else:
                sup.detach()
        if self.settings.stop_runs_on_exit:

            def join_all() -> list[str]:
                # One deadline for all: a start under load (the warm process still
                # importing) takes tens of seconds, and sees the stop flag when it ends.
                deadline = time.monotonic() + STOP_JOIN_S
                for t in list(self._starts.values()):
                    t.join(max(0.0, deadline - time.monotonic()))
                for s in sups:
                    s.join(max(0.0, deadline - time.monotonic()))
                return [run_id for run_id, t in list(self._starts.items()) if t.is_alive()]

            unstarted += await asyncio.to_thread(join_all)
            for _ in range(3):
                await asyncio.sleep(0)  # let the supervisors' last reports land
        await self.reports.stop()
        if self.settings.stop_runs_on_exit:
            # The runs' last states, in order; no waiting for the mirror, which stops.
            await self.reports.apply(last_copies=False)
            await self.ingest.last_pass()
            self._stopped_unstarted(unstarted)
        elif sups:
            log.info("%d run(s) keep training; the next server start adopts them", len(sups))
        if self.mirror is not None:
            # A copy in flight is abandoned (no manifest: it does not count); the next
            # start watches the runs again and copies their newest checkpoints.
            await asyncio.to_thread(self.mirror.stop)
        self.fanout.close()
        await self.ingest.close()
        self.close()

    def _stopped_unstarted(self, run_ids: list[str]) -> None:
        """Runs marked starting whose start was never begun or had not ended when the lab
        stopped (past STOP_JOIN_S): stored stopped, not left 'starting' for the next server
        start to resume. A start that ends later finds the stop flag and the warm process
        gone."""
        message = "Stopped: the server shut down before its trainer started."
        fields = {"state": RunState.STOPPED, "message": message}
        for run_id in run_ids:
            try:
                stored = self.store.update_run_if(
                    run_id, RunState.STARTING, ended_at=time.time(), **fields
                )
            except DatabaseUnavailable as e:
                self.outage.failed(e)
                return
            if stored:
                log.warning("run %s stopped: the server shut down before it started", run_id)

    def close(self) -> None:
        """Close the database and let go of the data dir (`stop` ends with this; a lab
        that was never started needs only this)."""
        self.executor.close()  # the warm process exits; its trainers keep training
        self.db.close()
        os.close(self._lock_fd)

    def _recover(self) -> None:
        """After a restart: adopt live trainers, resume dead ones, continue ingest."""
        for row in self.store.runs_in(ACTIVE_STATES):
            rd = RunDir(Path(row["run_dir"]))
            sup = self._supervisor(row)
            self.ingest.tail(row["id"])
            if sup.adopt([row["pid"], rd.run_json().get("pid")]):
                log.info("adopted the live trainer of run %s", row["id"])
                self.supervisors[row["id"]] = sup
                self.rearm(row, sup)
                continue
            _, _, stage = rd.last_seen()
            if stage in AFTER_TRAINING:  # finished, failed, diverged: its state too
                self.store.update_run(row["id"], state=stage, ended_at=time.time(), pid=None)
                self._release_mirror(row)
                continue
            log.info("resuming run %s, whose trainer died while the server was down", row["id"])
            self.supervisors[row["id"]] = sup
            sup.resume("The trainer stopped while the lab server was down")
        for row in self.store.runs_in(TERMINAL_STATES):
            path = RunDir(Path(row["run_dir"])).records
            if path.exists() and path.stat().st_size > row["ingest_offset"]:
                self.ingest.tail(row["id"])
            elif (Path(row["run_dir"]) / MIRROR_LOG).exists():
                self.ingest.tail(row["id"])  # mirror.jsonl's offset is not kept: read it again

    def _started(self, run_id: str, sup: Supervisor) -> None:
        """The scheduler took the run off the queue: watch it, read its files, start it.
        The start runs on a thread of its own: on a cluster it places an actor and waits
        for its node (seconds, more on a loaded cluster), which must not stall the loop
        that answers every request. A Stop before the trainer exists is kept by the
        supervisor and carried out when it does."""
        self.supervisors[run_id] = sup
        self.ingest.tail(run_id)
        who = self._stop_when_started.pop(run_id, None)
        if who is not None:
            sup.stop(who)

        def start() -> None:
            try:
                sup.start()
            except Exception as e:  # the executor's own failure (OSError is the supervisor's)
                log.exception("could not start run %s", run_id)
                fields = {"message": "Could not start the trainer.", "detail": repr(e)}
                self.store.update_run(run_id, state=RunState.FAILED, ended_at=time.time(), **fields)
                self.supervisors.pop(run_id, None)
                self.schedule()
            finally:
                self._starts.pop(run_id, None)

        thread = threading.Thread(target=start, name=f"start-{run_id}", daemon=True)
        self._starts[run_id] = thread
        thread.start()

    def _ended(self, run_id: str, row: Row) -> None:
        """A supervisor's report that the run ended is stored: its slot is free."""
        self.supervisors.pop(run_id, None)
        self._release_mirror(row)
        self.ingest.checks_due_now(run_id)
        self.schedule()

    def schedule(self) -> None:
        """Ask for a scheduling pass (from any thread)."""
        self.scheduler.schedule()

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
        after_crash = crash_settings(preset_ref)
        crashed = int(row["segment"] or 0) > 0  # a server restarted since: already taken on
        launch = Launch(
            run_dir=Path(row["run_dir"]),
            preset=preset_ref,
            label=row["label"],
            command=self.settings.trainer_command,
            env={
                **launch_env(preset_ref, row["label"], mode),
                CORPORA_DIR_VARIABLE: str(self.settings.corpora),
                NICE_VARIABLE: str(self.settings.trainer_nice),
            },
            env_pass=self.settings.trainer_env_pass,
            fresh_start_allowed=fresh_start_allowed(preset_ref, row["label"]),
            settings=after_crash if crashed else (),
            crash_settings=() if crashed else after_crash,
        )
        grace, wall = preemption(preset_ref, row["label"])
        return Supervisor(
            launch,
            self.reports.callback(row["id"]),
            mirror=self.settings.mirror_url,
            executor=self.executor,
            grace_s=grace,
            wall=Wall(wall, grace) if wall else None,
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
        client: str | None = None,
    ) -> dict[str, Any]:
        """`preset` (already resolved by the caller) or the built-in named `preset_name`.
        `frozen_text`: the preset as TOML, written to each run dir as FROZEN_PRESET and
        trained from there (instructor presets, a student's settings). `client`: the
        address the request came from (its pairs are counted, server/door/quotas.py)."""
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
        check_corpora(preset, self.settings.corpora)  # again: a preset dir may have changed
        disk_bytes = pair_disk_bytes(preset, LabLimits.from_settings(self.settings))
        with self._create_lock:  # the limits and the insert, one request at a time
            check_new_pair(
                self.settings,
                self.store,
                owner=owner,
                client=client,
                instructor=instructor,
                disk_free=self.housekeeping.disk_free,
                disk_bytes=disk_bytes,
            )
            return self._create_pair(preset, owner, public, frozen_text, client, disk_bytes)

    def _create_pair(
        self,
        preset: Preset,
        owner: str,
        public: dict[str, Any] | None,
        frozen_text: str | None,
        client: str | None,
        disk_bytes: int,
    ) -> dict[str, Any]:
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
                public or public_view(preset, LabLimits.from_settings(self.settings)),
                [(rid, label, str(self.settings.runs_dir / rid)) for rid, label in runs],
                client,
                disk_bytes,
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
        self.housekeeping.seen(pair_id)  # a poll: someone watches it
        positions = queue_positions(self.store.runs_in([RunState.QUEUED]))
        runs = self.store.runs_of_pair(pair_id)
        view = pair_view(
            pair,
            runs,
            positions,
            is_owner=pair["owner"] == session,
            waits=self.scheduler.waits.remaining(time.time()),
            start_times=self.start_times.summary(),
        )
        view["prediction"] = prediction_view(self.store, pair)
        view["executor"] = self.executor.name  # one machine ("local"), or a cluster's nodes
        dirs = {r["id"]: Path(r["run_dir"]) for r in runs}
        for run in view["runs"]:  # where each trains: this machine, or a Ray node
            host = self.executor.host(dirs[run["id"]]) if run["state"] != RunState.QUEUED else None
            run["host"] = host.to_dict() if host is not None else None
        return view

    # ---- reads ----------------------------------------------------------------------

    def resume_checks(self, run_id: str) -> list[dict[str, Any]]:
        return resume_checks(self.store, run_id)
