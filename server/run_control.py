"""The lab's requests that signal runs: Crash test, Preempt, Stop, and who may ask.
A part of the Lab facade (server/lab.py), which holds the state these use.

A crash test pressed while the run is starting, restarting (after a crash test, a
preemption or a lost host) or has not written the first step record of its newest segment
is taken, not refused: it is armed for the trainer's first step (server/lessons/pending_kill.py,
`first_step`), and the ingest loop fires it when that step record is stored (`stepped`):
the student pressed while a crowded machine was still starting their run, and the run
would have been crashed a moment later anyway.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from crashdrill.server.errors import Conflict, Forbidden, NotFound
from crashdrill.server.ingest_loop import IngestLoop
from crashdrill.server.lessons.crash_effects import chosen_mode
from crashdrill.server.lessons.pending_kill import (
    PREEMPT_MODE,
    armed_for_first_step,
    fires,
    pending_kill,
    signalled,
)
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import ACTIVE_STATES, TERMINAL_STATES, RunState, Store
from crashdrill.server.views import training
from crashdrill.trainer.crash_modes import mode_named
from crashdrill.trainer.stages import BEFORE_TRAINING, Stage
from crashdrill.workers.launch import NotRunning
from crashdrill.workers.supervisor import Supervisor

log = logging.getLogger(__name__)


HOLD_S = 90.0  # how long a hold lasts at most: a tab closed mid-answer lets the runs go
NOUNS = {"crash": "a crash test", "preempt": "a preemption", "hold": "a hold"}


def not_now(row: Row, verb: str, why: str) -> str:
    """Why `verb` cannot hit the run now, in a student's words: the run by its label (A or
    B, never its internal id), what it is doing, and when the action works."""
    text = f"run {row['label']} {why}: {NOUNS.get(verb, verb)} hits a run while it trains"
    if row["state"] in TERMINAL_STATES:
        text += "; start the lesson again to try it on a new pair of runs"
    return text[0].upper() + text[1:]


class RunControl:
    """Crash, preempt and stop runs (the Lab's state: its store, its supervisors by run,
    its ingest loop, its scheduling signal, and the stops asked for while starting)."""

    store: Store
    supervisors: dict[str, Supervisor]
    ingest: IngestLoop
    _stop_when_started: dict[str, str]
    schedule: Callable[[], None]
    _first_step_kills: set[str]  # runs with a crash test armed for their first step

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

    def _training(self, row: Row, verb: str) -> Supervisor:
        """The supervisor of a run that is training now, which a crash test or a
        preemption may hit; Conflict saying why not otherwise. Training: in stage train,
        with a step record of its newest segment (views.training), and not signalled
        by an earlier crash test or preemption whose restart has written no step yet (the
        run's pending kill, server/lessons/pending_kill.py: kept in its row, so a server restart
        keeps it too)."""
        state, stage = row["state"], row["stage"]
        latest = json.loads(row["latest_json"] or "{}")
        pending = pending_kill(row, latest)
        if pending is not None:
            why = "is restarting after a crash test or a preemption"
            if pending.get("first_step"):
                why = "has a crash test armed: its SIGKILL lands at the trainer's first step"
            elif pending["armed"]:
                why = "has a crash test armed: its SIGKILL lands at the next checkpoint write"
            raise Conflict(not_now(row, verb, why))
        if not training(row, latest):
            why = {
                RunState.QUEUED: "is still queued",
                RunState.STARTING: "is still starting",
                RunState.RESTARTING: "is resuming after a crash",
                RunState.RUNNING: f"is in stage {stage!r}, not training yet",
                RunState.FINISHED: "has finished",
            }.get(state, f"has {state}")
            if state in ACTIVE_STATES and stage == Stage.TRAIN:
                why = "has written no training step yet"
            raise Conflict(not_now(row, verb, why))
        sup = self.supervisors.get(row["id"])
        if sup is None:
            raise Conflict(not_now(row, verb, "has no trainer process the lab watches"))
        return sup

    def preempt(self, run_id: str, session: str, instructor: bool) -> dict[str, Any]:
        """Preempt a training run as a platform does: SIGTERM now, SIGKILL after the run's
        grace unless it has stopped; it resumes from what it saved. The run stays
        `running` until the trainer ends (the grace is its to use)."""
        row = self.check_may_control(run_id, session, instructor)
        sup = self._training(row, "preempt")
        try:
            pid = sup.preempt()
        except NotRunning as e:
            raise Conflict(not_now(row, "preempt", f"cannot take it now ({e})")) from None
        self.store.update_run(
            run_id, pending_kill_json=signalled("preempt", PREEMPT_MODE, row), held_json=None
        )
        self.ingest.publish_run(run_id)
        return {
            "run": run_id,
            "signalled_pid": pid,
            "at_step": row["step"],
            "grace_s": sup.grace_s,
            "state": row["state"],
        }

    def crash(
        self, run_id: str, session: str, instructor: bool, asked: str | None = None
    ) -> dict[str, Any]:
        """`asked`: a crash mode the lesson offers besides its own (None: its own)."""
        row = self.check_may_control(run_id, session, instructor)
        mode = chosen_mode(self.store.pair(row["pair_id"]), asked)
        latest = json.loads(row["latest_json"] or "{}")
        if _before_first_step(row, latest):
            return self._arm_for_first_step(row, latest, mode)
        sup = self._training(row, "crash")
        return self._signal_crash(row, sup, mode)

    def _arm_for_first_step(self, row: Row, latest: dict[str, Any], mode: str) -> dict[str, Any]:
        """A run not training yet: the kill waits for its trainer's first step record."""
        run_id = row["id"]
        self.store.update_run(run_id, pending_kill_json=armed_for_first_step(mode, row, latest))
        self._first_step_kills.add(run_id)
        self.ingest.publish_run(run_id)
        self.fire_first_step_kill(run_id)  # its step may be stored already
        return {
            "run": run_id,
            "killed_pid": None,
            "at_step": row["step"],
            "state": self.run_row(run_id)["state"],
            "crash_mode": mode,
            "armed": True,
            "first_step": True,
        }

    def fire_first_step_kill(self, run_id: str) -> None:
        """The ingest stored a step record of the run (on the loop): a crash test armed
        for its first step lands now, as a press would (a crash mode that waits for a save
        arms that wait now). Gone without a trace it is not: a trainer that ended first
        clears it, said in the log."""
        if run_id not in self._first_step_kills:
            return
        row = self.store.run(run_id)
        latest = json.loads((row or {}).get("latest_json") or "{}")
        pending = pending_kill(row, latest) if row is not None else None
        if row is None or pending is None or not pending.get("first_step"):
            self._first_step_kills.discard(run_id)
            return
        if not (training(row, latest) and fires(pending, latest)):
            return  # not its first step yet (or not the newest segment's)
        self._first_step_kills.discard(run_id)
        sup = self.supervisors.get(run_id)
        try:
            if sup is None:
                raise NotRunning("no trainer process is watched")
            self._signal_crash(row, sup, pending["mode"])
        except (NotRunning, Conflict) as e:
            log.warning("the crash test armed for run %s's first step is gone: %s", run_id, e)
            self.store.update_run(run_id, pending_kill_json=None)
            self.ingest.publish_run(run_id)

    def _signal_crash(self, row: Row, sup: Supervisor, mode: str) -> dict[str, Any]:
        run_id = row["id"]
        try:
            pid = sup.crash(mode)
        except NotRunning as e:
            raise Conflict(not_now(row, "crash", f"cannot take it now ({e})")) from None
        pending = signalled("crash", mode, row)
        # A mode that waits for a save ("during_save") arms the kill: it lands when the next
        # checkpoint write begins, and the run trains on until then. Its state says
        # restarting only once the supervisor reports the trainer dead (server/reports.py).
        armed = mode_named(mode).waits_for_save
        state = row["state"] if armed else RunState.RESTARTING
        if armed:
            self.store.update_run(
                run_id, crashes=row["crashes"] + 1, pending_kill_json=pending, held_json=None
            )
        else:
            self.store.update_run(
                run_id,
                state=RunState.RESTARTING,
                stage=Stage.RESTARTING,
                crashes=row["crashes"] + 1,
                pending_kill_json=pending,
                held_json=None,
            )
        self.ingest.publish_run(run_id)
        return {
            "run": run_id,
            "killed_pid": pid,
            "at_step": row["step"],
            "state": state,
            "crash_mode": mode,
            "armed": armed,
        }

    def hold_pair(self, pair_id: str, session: str, instructor: bool, hold: bool) -> dict[str, Any]:
        """Hold both training runs of a pair where they are while its owner answers the
        lesson's question (hold=True), or let them go on (False). A run that is not
        training (queued, restarting, ended, a kill pending) is left as it is: the answer
        names the runs held. A hold ends by itself after HOLD_S; a crash test,
        preemption or stop of a held run releases it first."""
        pair = self.store.pair(pair_id)
        if pair is None:
            raise NotFound(f"no pair {pair_id!r}")
        if not instructor and pair["owner"] != session:
            raise Forbidden("only the browser that started this lesson may hold its runs")
        held = []
        for row in self.store.runs_of_pair(pair_id):
            sup = self.supervisors.get(row["id"])
            latest = json.loads(row["latest_json"] or "{}")
            may_hold = training(row, latest) and pending_kill(row, latest) is None
            if hold and sup is not None and may_hold and sup.hold(HOLD_S):
                now = time.time()
                at = {"at_step": row["step"], "since": now, "until": now + HOLD_S}
                self.store.update_run(row["id"], held_json=json.dumps(at))
                held.append(row["label"])
            elif not hold or row["held_json"]:
                if sup is not None:
                    sup.release()
                self.store.update_run(row["id"], held_json=None)
            self.ingest.publish_run(row["id"])
        return {"pair": pair_id, "held": held, "hold_s": HOLD_S if held else 0.0}

    def rearm(self, row: Row, sup: Supervisor) -> None:
        """After a server restart that adopted the run's trainer (`sup`): an armed crash
        test is armed again (its watch for the checkpoint write died with the old server;
        the student's press did not), or forgotten, said in the log, when it cannot be."""
        pending = pending_kill(row, json.loads(row["latest_json"] or "{}"))
        if pending is None or not pending["armed"]:
            return
        if pending.get("first_step"):  # the ingest fires it at the trainer's first step
            self._first_step_kills.add(row["id"])
            self.fire_first_step_kill(row["id"])
            return
        try:
            sup.crash(pending["mode"])
            log.info("armed the crash test of run %s again", row["id"])
        except (NotRunning, ValueError) as e:
            log.warning("the armed crash test of run %s is gone: %s", row["id"], e)
            self.store.update_run(row["id"], pending_kill_json=None)

    def stop_run(self, run_id: str, session: str, instructor: bool) -> dict[str, Any]:
        row = self.check_may_control(run_id, session, instructor)
        who = (
            "an instructor"
            if instructor and self.store.owner_of_run(run_id) != session
            else "its owner"
        )
        if row["state"] == RunState.QUEUED:
            if not self.store.update_run_if(
                run_id,
                RunState.QUEUED,
                state=RunState.STOPPED,
                ended_at=time.time(),
                message=f"Stopped by {who}.",
            ):
                raise Conflict(f"cannot stop run {run_id}: it is starting; try again in a moment")
            self.schedule()
        elif row["state"] in ACTIVE_STATES and run_id in self.supervisors:
            self.supervisors[run_id].stop(who)
        elif row["state"] == RunState.STARTING:
            # Taken off the queue, its supervisor not registered yet: stop it once it is.
            self._stop_when_started[run_id] = who
            sup = self.supervisors.get(run_id)
            if sup is not None and self._stop_when_started.pop(run_id, None) is not None:
                sup.stop(who)
        else:
            raise Conflict(f"cannot stop run {run_id}: it has {row['state']}")
        self.ingest.publish_run(run_id)
        return {"run": run_id, "state": self.run_row(run_id)["state"], "stopping": True}

    def stop_pair(self, pair_id: str, who: str) -> None:
        """Stop the pair's queued and active runs, "Stopped by WHO." (on the loop: the
        housekeeping's stop of a pair nobody watches)."""
        for row in self.store.runs_of_pair(pair_id):
            if row["state"] == RunState.QUEUED:
                message = f"Stopped by {who}."
                fields = {"state": RunState.STOPPED, "ended_at": time.time(), "message": message}
                if not self.store.update_run_if(row["id"], RunState.QUEUED, **fields):
                    continue
            elif row["state"] in ACTIVE_STATES and row["id"] in self.supervisors:
                self.supervisors[row["id"]].stop(who)
            else:
                continue
            self.ingest.publish_run(row["id"])
        self.schedule()


def _before_first_step(row: Row, latest: dict[str, Any]) -> bool:
    """Active and not training yet: starting, restarting after a kill (whose restart has
    written no step record yet), or in stage train with no step of its newest segment. A
    crash test pressed then is armed for the first step; a run in any other stage (finished,
    failed) is past crashing."""
    if row["state"] not in ACTIVE_STATES:
        return False
    pending = pending_kill(row, latest)
    if pending is not None:
        return not pending["armed"]  # a kill's restart; a second armed one is refused
    if training(row, latest):
        return False
    return row["stage"] in (*BEFORE_TRAINING, Stage.TRAIN)  # trainer/stages.py
