"""Supervisor of one training run: start the trainer, restart it after SIGKILL.

(Around 600 lines, one module on purpose. The restart policy — crash modes, preemptions,
lost hosts, stops, restarts and failures — is one state machine: `crash`, `preempt`,
`hold` and `stop` (other threads: a request) set the flags that `_after_exit` (the
watcher's thread) reads and clears under one lock, and a start checks them again after
it returns. Split by role (starting, the watcher, endings) the flags would be shared
across modules through mixins or a state object every part mutates, and whether a
request racing a death is seen once and only once would no longer be readable in one
place. What is not the state machine already lives elsewhere: its sentences in
workers/restart_events.py and workers/graceful_stop.py, its data in workers/launch.py,
holding a trainer in workers/hold.py, its process handling in the executor. Read it by
its sections, in order: starting, signals from people, the watcher, endings, through
the executor.)

    sup = Supervisor(Launch(run_dir, "quick", "A"), on_change=print)
    sup.start()          # trainer in its own session; stdout/stderr go to files in run_dir
    sup.crash()          # a crash test: SIGKILL, then a restart with --require-checkpoint
    sup.preempt(30)      # SIGTERM, SIGKILL after 30 s unless it stopped; then a resume
    sup.hold(60)         # stop the trainer where it is (a student answering), ≤ 60 s,
                         # never inside a checkpoint write (workers/hold.py)
    sup.release()        # let it go on (a crash test, preemption or stop releases too)
    sup.stop("its owner")

A trainer that dies by SIGKILL (a crash test, or the out-of-memory killer) is restarted
with `--require-checkpoint` once the run has saved a checkpoint, so it resumes from its
newest complete checkpoint (or refuses, exit 3, when that is gone) and writes the next
segment; a run that never saved one starts over from step 0, and the event says how many
steps that lost.

Crash modes (`crash(mode)`, from the lesson's `[crash] mode`; the registry is
trainer/crash_modes.py): "kill" SIGKILLs now; a mode that `waits_for_save` ("during_save")
SIGKILLs as soon as the trainer says it is inside a checkpoint write (the lab starts such
runs with the checkpoint-pause hook, trainer/checkpoint_pause.py, which holds each write
open); one that `wipes_disk` ("wipe") SIGKILLs and then deletes the run's local checkpoint
directory, like a disk that vanished with the session; one that also `moves_host`
("host") restarts the run on another machine (a Ray node), which pulls the newest
verified checkpoint from the mirror; one that kills `one_rank` ("rank") SIGKILLs one
rank's process of a run with several (workers/rank_crash.py finds it; its launcher takes
the group down) and the restart event names the rank. A launch with `crash_settings` (a
lesson's `[crash] restart_ranks`) takes them on at the first crash test, for every later
start: the run resumes on another world size, and the restart event says so. A trainer
whose machine vanishes (`lost_host`) is restarted elsewhere the same way, unasked.
A preemption (`preempt(grace_s)`) is the announced death of spot VMs and SLURM: SIGTERM,
then SIGKILL when the grace runs out. A trainer that stops gracefully (exit 75: a complete
checkpoint of its last step) is restarted as a resume whose event says the stop lost
nothing (it saved the step it stopped at); so is one that stopped itself (its time
budget) or was SIGTERMed by its machine; one that died on the SIGTERM or was SIGKILLed
after the grace resumes from its newest complete checkpoint, and the event counts the
steps lost (workers/graceful_stop.py).
Exit 0 is finished; exit 4 (trainer/divergence.py) is a run that diverged: its loss
or gradient turned NaN or infinite, and it is not restarted (it would diverge again, bit
for bit). Every other death marks the run failed: the event says how it ended, and the
stderr tail (a traceback, the server's paths) goes to the lab's log and to
`Change.detail` (the instructor's class view), never into the records a student reads.
The supervisor writes its events into the run's records.jsonl (only while no trainer is
alive), so the file tells the whole story in order.

The trainer runs in its own session with its output in files, not pipes: it outlives a
server that is killed, and a new server adopts it (`adopt`). Where it runs, and how it is
started, found, waited for and signalled, is the executor's (workers/executor.py: this
machine by default, workers/local_executor.py, or a Ray node, workers/ray_executor.py),
and so is the run dir where it runs (`self.files`, a RunFiles); which checkpoint a
restart resumes from is the checkpoint layout's rule (trainer/checkpoint_layout.py). The
trainer's environment is an allowlist (workers/trainer_env.py), never the server's secrets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from crashdrill.trainer.checkpoint_pause import (
    ANNOUNCE_ENV,
    paused_step,
    without_write_lines,
    write_open,
)
from crashdrill.trainer.crash_modes import DEFAULT as DEFAULT_CRASH_MODE
from crashdrill.trainer.crash_modes import HOST_LOSS, mode_named
from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.exit_codes import EXIT_DIVERGED, EXIT_OK
from crashdrill.trainer.stages import Stage
from crashdrill.workers.executor import Executor, ExecutorError, Host, NoRoomForRanks, Trainer
from crashdrill.workers.graceful_stop import (
    PREEMPT_GRACE_S,
    Preemption,
    StopHistory,
    Wall,
    count_the_cost,
    is_stop,
    trainer_stop,
)
from crashdrill.workers.hold import Hold
from crashdrill.workers.launch import ENDED, Change, Launch, NotRunning
from crashdrill.workers.local_executor import LocalExecutor
from crashdrill.workers.mirror import Restored
from crashdrill.workers.rank_crash import (
    RankTarget,
    blind_wait,
    lost_rank_fields,
    rank_lead,
)
from crashdrill.workers.restart_events import (
    diverged_text,
    failure_text,
    moved_event,
    restart_event,
)
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.trainer_env import (
    trainer_environment,
    writes_gcs_mirror,
)

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0


class Supervisor:
    """Watches one run's trainer in a thread; restarts it after SIGKILL."""

    def __init__(
        self,
        launch: Launch,
        on_change: Callable[[Change], None],
        *,
        max_unrequested_kills: int = 5,
        poll_s: float = 0.2,
        mirror: str | None = None,
        executor: Executor | None = None,
        grace_s: float = PREEMPT_GRACE_S,
        wall: Wall | None = None,
    ) -> None:
        self.launch = launch
        self._mirror = mirror  # checkpoint mirror URL: a restart with none on disk pulls one
        self.executor: Executor = executor or LocalExecutor()
        self.executor.prepare(launch)  # what the run needs wherever it is placed
        self.files = self.executor.files(launch.run_dir)  # where the trainer runs
        self.run_dir = RunDir(launch.run_dir)  # the server's copy: records, mirror log
        self._on_change = on_change
        self._max_unrequested = max_unrequested_kills
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._proc: Trainer | None = None
        self._thread: threading.Thread | None = None
        self._crash_requested = False
        self._crash_mode = DEFAULT_CRASH_MODE
        self._crash_save_step: int | None = None
        self._crash_rank: RankTarget | None = None  # the rank a rank crash killed
        self._stop_requested: str | None = None
        self._preempt: Preemption | None = None
        self._stop_kill: threading.Timer | None = None  # a Stop's SIGKILL after its grace
        self._stops = StopHistory()
        self.grace_s = grace_s  # a preemption's, between its SIGTERM and its SIGKILL
        self._wall = wall  # a lesson's session wall: preempted once past its step
        self._detached = False
        self._unrequested_kills = 0
        self._stderr_since = 0
        self._hold = Hold(launch.run_dir.name, self._write_open)  # workers/hold.py

    # ---- starting -------------------------------------------------------------------

    def start(self) -> None:
        """Start the trainer for the first time (it resumes if a checkpoint exists)."""
        self._spawn(require_checkpoint=False)
        self._watch_in_thread()

    def resume(self, reason: str) -> None:
        """Restart a trainer that died unseen (e.g. while the server was down)."""
        segment, step, _ = self.run_dir.last_seen()
        self._restart(reason, segment, step, code="lost", level="warn")
        self._watch_in_thread()

    def adopt(self, pids: Iterable[int | None]) -> bool:
        """Watch a trainer of this run that is still alive; False when there is none."""
        proc = self.executor.adopt(self.launch.run_dir, pids)
        if proc is None:
            return False
        with self._lock:
            self._proc = proc
        # A server that died while it held this trainer left it stopped: it goes on now.
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            proc.signal(signal.SIGCONT)
        self._stderr_since = max(0, self._stderr_size() - 4096)
        self._notify(Change("running", pid=proc.pid, pid_started=proc.started))
        self._watch_in_thread()
        return True

    # ---- signals from people ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc else None

    def crash(self, mode: str = DEFAULT_CRASH_MODE) -> int:
        """Crash test: SIGKILL the trainer (now, or for "during_save" inside its next
        checkpoint write; for a mode that kills `one_rank`, one rank's process alone).
        Returns the pid that is killed; CrashModeError (a ValueError) for a mode that is
        not in the registry; NotRunning (RankCrashRefused, saying why) for a rank crash of
        a one-rank run or of a group not started yet."""
        spec = mode_named(mode)
        with self._lock:
            proc = self._proc
            if proc is None or self._stop_requested:
                raise NotRunning("the trainer is not running")
            if self._crash_requested or self._preempt is not None:
                raise NotRunning("a crash test or a preemption is already on its way")
            target: RankTarget | None = None
            self._crash_requested = True
            self._crash_mode = mode
            self._crash_save_step = None
            if spec.waits_for_save:
                since = self._stderr_size()
                threading.Thread(
                    target=self._kill_inside_save,
                    args=(proc, since),
                    name=f"crash-during-save-{self.launch.run_dir.name}",
                    daemon=True,
                ).start()
                self._hold.release()  # it trains on to its next checkpoint write
                return proc.pid
            try:
                if spec.one_rank:  # one rank, where it runs: its launcher takes the group down
                    target = self.files.kill_rank(proc.pid)
                    self._crash_rank = target
                else:
                    proc.signal(signal.SIGKILL)  # held or not: killed at the step it is at
            except (ProcessLookupError, psutil.NoSuchProcess):
                self._crash_requested = False
                raise NotRunning("the trainer has already exited") from None
            except NotRunning:
                self._crash_requested = False
                raise
            self._hold.release()
            return target.pid if target is not None else proc.pid

    def preempt(self, grace_s: float | None = None, name: str = "Preempted") -> int:
        """Preempt the trainer as a platform does: SIGTERM now, SIGKILL after `grace_s`
        (default: the run's) unless it has ended; then a restart that resumes. Returns the
        pid signalled."""
        grace_s = self.grace_s if grace_s is None else grace_s
        with self._lock:
            proc = self._proc
            if proc is None or self._stop_requested:
                raise NotRunning("the trainer is not running")
            if self._crash_requested or self._preempt is not None:
                raise NotRunning("a crash test or a preemption is already on its way")
            try:
                step = self.run_dir.last_seen()[1]
                self._preempt = Preemption(proc, grace_s, step, name)
            except (ProcessLookupError, psutil.NoSuchProcess):
                raise NotRunning("the trainer has already exited") from None
            self._hold.release()  # the SIGTERM is delivered once it runs again
            return proc.pid

    def hold(self, seconds: float) -> bool:
        """Stop the trainer where it is for at most `seconds` while a student answers the
        lesson's question (workers/hold.py); False when no trainer runs or a crash test,
        preemption or stop is on its way."""
        with self._lock:
            proc = self._proc
            if proc is None or self._stop_requested:
                return False
            if self._crash_requested or self._preempt is not None:
                return False
            return self._hold.start(proc, seconds)

    def release(self) -> bool:
        """Let a held trainer go on; False when it was not held."""
        return self._hold.release()

    @property
    def held(self) -> bool:
        return self._hold.held

    def _write_open(self) -> int | None:
        """The step of the checkpoint write the trainer is inside now (it says so on
        stderr, trainer/checkpoint_pause.py), else None."""
        try:
            since = max(self._stderr_since, self._stderr_size() - 65536)
            return write_open(self.files.stderr_since(since))
        except Exception:  # its host going away: the watcher hears of it
            return None

    def _kill_inside_save(self, proc: Trainer, since: int) -> None:
        """Wait for the trainer to announce a paused checkpoint write, then SIGKILL it."""
        buf = b""
        while self._proc is proc and not self._detached:
            try:
                chunk = self.files.stderr_since(since)
            except Exception:  # its host going away: the watcher hears of it
                chunk = b""
            since += len(chunk)
            buf = (buf + chunk)[-4096:]
            paused = paused_step(buf)
            if paused is not None:
                with self._lock:
                    if self._proc is not proc:
                        return
                    self._crash_save_step = paused
                    with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                        proc.signal(signal.SIGKILL)
                return
            threading.Event().wait(0.02)

    def stop(self, who: str) -> None:
        """Stop for good: SIGTERM, then SIGKILL after a grace period; no restart."""
        with self._lock:
            self._stop_requested = who
            proc = self._proc
        if proc is None:
            self._hold.close()
            # Starting (maybe waiting for a node) or between a death and a restart: a
            # start that waits gives up, and the next one sees the flag.
            self.executor.cancel(self.launch.run_dir)
            return
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            proc.signal(signal.SIGTERM)
        self._hold.close()  # a held trainer hears the SIGTERM once it runs again; no new hold

        def _kill() -> None:
            with self._lock:  # only the trainer still watched: a pid may be reused, and an
                if self._proc is not proc:  # ended lab's executor may be closed
                    return
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                proc.signal(signal.SIGKILL)

        timer = threading.Timer(STOP_GRACE_S, _kill)
        timer.daemon = True
        with self._lock:
            self._stop_kill = timer
        timer.start()

    def detach(self) -> None:
        """Stop watching and leave the trainer running (a server shutting down)."""
        self._detached = True
        self._hold.close()  # never left stopped with nobody to release it

    def join(self, timeout: float | None = None) -> None:
        with self._lock:
            thread = self._thread  # set only once started (a start may be on its way)
        if thread is not None:
            thread.join(timeout)

    # ---- the watcher ----------------------------------------------------------------

    def _watch_in_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        name = f"supervisor-{self.launch.run_dir.name}-{self.launch.label}"
        thread = threading.Thread(target=self._watch, name=name, daemon=True)
        thread.start()
        with self._lock:  # a join (the lab stopping) may come from another thread
            self._thread = thread

    def _watch(self) -> None:
        while not self._detached:
            proc = self._proc
            if proc is None:
                return
            try:
                code = proc.wait(self._poll_s)
            except TimeoutError:
                if self._wall is not None and self._wall.due(self.run_dir):
                    with contextlib.suppress(NotRunning):
                        self.preempt(self._wall.grace_s, self._wall.name())
                continue
            if self._detached:
                return
            try:
                if not self._after_exit(code, proc.lost_host):
                    return
            except Exception as e:  # never leave a run silently unwatched
                log.exception("supervisor of %s failed", self.launch.run_dir)
                self._fail(
                    f"The supervisor itself failed ({type(e).__name__}).",
                    exit_code=None,
                    detail=repr(e),
                )
                return

    def _after_exit(self, code: int | None, lost_host: Host | None = None) -> bool:
        """Decide what a death means; True when a new trainer is being watched."""
        with self._lock:
            crash, stop = self._crash_requested, self._stop_requested
            mode, save_step = self._crash_mode, self._crash_save_step
            lost_rank, self._crash_rank = self._crash_rank, None
            preempt, self._preempt = self._preempt, None
            stop_kill, self._stop_kill = self._stop_kill, None
            self._crash_requested = False
            self._proc = None
        if preempt is not None:
            preempt.cancel()  # it ended: no SIGKILL for a pid that may be reused
        if stop_kill is not None:
            stop_kill.cancel()  # the same for a Stop's
        segment, step, stage = self.run_dir.last_seen()
        if code == EXIT_OK or (code is None and stage == Stage.FINISHED and not stop):
            self._notify(Change("finished", exit_code=code))
            return False
        if code == EXIT_DIVERGED or (code is None and stage == Stage.DIVERGED):
            # Not a crash: a restart would resume the checkpoint before it and diverge again.
            text = diverged_text(self.run_dir.tail_records(), step)
            self._notify(Change("diverged", exit_code=code, text=text))
            return False
        if stop:
            self._stopped(stop, segment)
            return False
        if lost_host is not None:
            return self._restart_elsewhere(f"Lost host {lost_host.name}", lost_host, segment, step)
        saved = trainer_stop(self.run_dir, segment)
        if not crash and is_stop(preempt, code, saved):
            lead, level, why = self._stops.after(preempt, code, saved, step, self.run_dir)
            if why is None:
                self._fail(lead, exit_code=code, segment=segment)
                return False
            return self._restart(
                lead, segment, step, code=why, level=level, mode="preempt", stopped=True
            )
        self._stops.reset()
        killed = code == -signal.SIGKILL or (code is None and stage != Stage.FAILED)
        if crash:
            lead = "Crash test: killed the process with SIGKILL (no chance to save)"
            if step is not None:
                lead += f" at step {step}"
            if save_step is not None:
                lead += f", in the middle of writing the checkpoint for step {save_step}"
            rank_fields = lost_rank_fields(self.run_dir, lost_rank) if lost_rank else None
            if lost_rank is not None and rank_fields is not None:
                lead = rank_lead(lost_rank, rank_fields, step, blind_wait(self.run_dir))
            had = self._checkpoint_step() is not None
            spec = mode_named(mode)
            if self.launch.crash_settings:  # the lesson restarts it changed (restart_ranks)
                lead += ". The lesson restarts it with " + ", ".join(self.launch.crash_settings)
                self.launch = self.launch.after_crash()
            if spec.wipes_disk:
                lead += self._wipe_checkpoints()
            if spec.moves_host:
                host = self.executor.host(self.launch.run_dir)
                if host is not None:
                    try:
                        new, fewer = self._relocate()
                    except ExecutorError as e:  # no node could take its ranks: said
                        self._fail(f"{lead}: {e}", exit_code=None, segment=segment)
                        return False
                    if new is not None:
                        lead = f"Crash test: lost host {host.name}"
                        return self._restart_elsewhere(
                            lead, host, segment, step, moved=mode, fewer=fewer
                        )
                lead += (
                    ". There is no other machine to move to (the lab runs without a Ray"
                    " cluster), so the run restarts here, as in the wipe mode"
                )
            return self._restart(
                lead,
                segment,
                step,
                code="crash",
                level="info",
                had_checkpoint=had,
                mode=mode,
                save_step=save_step,
                lost_rank=rank_fields,
            )
        if killed:
            self._unrequested_kills += 1
            if self._unrequested_kills > self._max_unrequested:
                self._fail(
                    f"The trainer was killed {self._unrequested_kills} times without a crash"
                    " test; giving up.",
                    exit_code=code,
                )
                return False
            lead = (
                "The trainer was killed by SIGKILL without a crash test"
                " (perhaps the out-of-memory killer)"
            )
            return self._restart(lead, segment, step, code="killed", level="warn")
        self._fail(
            failure_text(code), exit_code=code, segment=segment, stage=stage, detail=self._tail()
        )
        return False

    def _wipe_checkpoints(self) -> str:
        """Delete the run's local checkpoints (a crash mode that `wipes_disk`); the sentence
        for the event."""
        ckpt = self._checkpoint_step()
        self.files.wipe()
        gone = f", the checkpoint at step {ckpt} with it" if ckpt is not None else ""
        return (
            ". Its disk went with it: the run's checkpoint directory was deleted, like local"
            f" storage that vanishes with the session{gone}"
        )

    def _restart(
        self,
        lead: str,
        segment: int,
        step: int | None,
        *,
        code: str,
        level: str,
        had_checkpoint: bool | None = None,
        mode: str = "kill",
        stopped: bool = False,
        save_step: int | None = None,
        lost_rank: dict[str, Any] | None = None,
    ) -> bool:
        """Restart the trainer. Once the run has saved a checkpoint (`had_checkpoint`,
        default: one exists now) the restart requires one: resume it or refuse, never a
        silent fresh start. A run that never saved starts over, and the event says so."""
        ckpt = self._checkpoint_step()
        pulled = self._pull_from_mirror(segment) if ckpt is None else None
        if pulled is not None:
            ckpt = pulled.step
        require = ckpt is not None or bool(had_checkpoint)
        event = restart_event(
            lead,
            segment,
            step,
            ckpt,
            pulled,
            require,
            code=code,
            level=level,
            mode=mode,
            fresh=self.launch.fresh_start_allowed,
            save_step=save_step,
            lost_rank=lost_rank,
        )
        if stopped:
            event = count_the_cost(event)
        text = event["text"]
        self._append([event])
        self._notify(Change("restarting", text=text))
        return self._spawn(require_checkpoint=require)

    def _restart_elsewhere(
        self,
        lead: str,
        old: Host,
        segment: int,
        step: int | None,
        *,
        moved: str | None = None,
        fewer: tuple[int, int] | None = None,
    ) -> bool:
        """The run's machine is gone (or taken away by a crash test of the mode `moved`, one
        that moves_host): restart it on another one, from the newest verified checkpoint
        in the mirror. `fewer`: (ranks it had, ranks it restarts on), where the move found
        no node with room for the whole group."""
        times: dict[str, float] = {}
        if moved is None:
            times["noticed_t"] = time.time()
            try:
                _, fewer = self._relocate()
            except ExecutorError as e:  # no node could take its ranks: said, not waited for
                at = f" at step {step}" if step is not None else ""
                self._fail(f"{lead}{at}: {e}", exit_code=None, segment=segment)
                return False
            times["placed_t"] = time.time()
        new = self.executor.host(self.launch.run_dir)
        ckpt = self._checkpoint_step()
        pulled = self._pull_from_mirror(segment) if ckpt is None else None
        if pulled is not None:
            ckpt = pulled.step
        event = moved_event(
            lead,
            old,
            new,
            segment,
            step,
            ckpt,
            pulled,
            moved=moved is not None,
            mode=moved or HOST_LOSS,
            times=times,
            ranks=int((self.run_dir.run_json().get("config") or {}).get("ranks") or 1),
            fewer=fewer,
        )
        self._append([event])
        self._notify(Change("restarting", text=event["text"]))
        return self._spawn(require_checkpoint=True)

    def _relocate(self) -> tuple[Host | None, tuple[int, int] | None]:
        """Move the run to another node at its world size; where no node has room for the
        whole group any more, on the most ranks one has room for, for good (its trainer
        reshards a DCP checkpoint of global data positions, and refuses any other, saying
        why). Returns its new host (None: no other node is alive) and, for a restart on
        fewer ranks, (ranks it had, ranks it restarts on)."""
        try:
            return self.executor.relocate(self.launch.run_dir), None
        except NoRoomForRanks as e:
            if e.fits < 1:
                raise
            self.launch = self.launch.with_ranks(e.fits)
            self.executor.prepare(self.launch)
            return self.executor.relocate(self.launch.run_dir), (e.ranks, e.fits)

    def _pull_from_mirror(self, segment: int) -> Restored | None:
        """No checkpoint on disk (a wiped disk, a new machine): the newest mirrored one
        that verifies, pulled into the run dir; warnings for copies that did not verify."""
        if self._mirror is None:
            return None
        pull = self.files.pull_from_mirror(self._mirror, segment)
        if pull.events:
            self._append(pull.events)
        return pull.restored

    def _spawn(self, *, require_checkpoint: bool) -> bool:
        with self._lock:
            stop = self._stop_requested
        if stop:
            self._stopped(stop, self.run_dir.last_seen()[0])
            return False
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        env = trainer_environment(
            os.environ,
            {**self.launch.env, ANNOUNCE_ENV: "1"},  # its writes said: a hold avoids them
            passes=self.launch.env_pass,
            gcs=writes_gcs_mirror(self.launch.command),
        )
        try:
            self._stderr_since = self._stderr_size()
            proc = self.executor.start(self.launch, env, require_checkpoint=require_checkpoint)
        except OSError as e:
            with self._lock:
                stop = self._stop_requested
            if stop:  # stopped while the start waited (StartCancelled, or a failure then)
                self._stopped(stop, self.run_dir.last_seen()[0])
                return False
            what = self.launch.command[0]
            self._fail("Could not start the trainer.", exit_code=None, detail=f"{what}: {e}")
            return False
        with self._lock:
            self._proc = proc
            late = self._stop_requested  # a Stop while it started (or waited for a node)
        self._notify(Change("running", pid=proc.pid, pid_started=proc.started))
        if late:
            self.stop(late)
        return True

    # ---- endings --------------------------------------------------------------------

    def _tail(self) -> str:
        """The end of the trainer's stderr since its start (a traceback, paths): for the
        lab's log and the instructor, never for the records."""
        try:
            return without_write_lines(self.files.stderr_tail(self._stderr_since))
        except Exception:  # its host is gone with its error output
            return ""

    def _fail(
        self,
        text: str,
        *,
        exit_code: int | None,
        segment: int | None = None,
        stage: str | None = None,
        detail: str = "",
    ) -> None:
        if detail:
            log.warning("run %s failed: %s\n%s", self.launch.run_dir, text, detail)
        if segment is None:
            segment, _, stage = self.run_dir.last_seen()
        records: list[dict[str, Any]] = [
            build_event("failed", text, segment=segment, exit_code=exit_code)
        ]
        if stage != Stage.FAILED:
            records.append(
                {"kind": "stage", "segment": segment, "stage": Stage.FAILED, "progress": 1}
            )
        try:
            self._append(records)
        except OSError:  # the run is failed either way; say so even if the disk will not
            log.exception("could not write the failure of %s", self.launch.run_dir)
        self._notify(Change("failed", exit_code=exit_code, text=text, detail=detail))

    def _stopped(self, who: str, segment: int) -> None:
        text = f"Stopped by {who}."
        self._append([build_event("stopped", text, segment=segment, by=who)])
        self._notify(Change("stopped", text=text))

    # ---- through the executor --------------------------------------------------------

    def _append(self, records: list[dict[str, Any]]) -> None:
        """The supervisor's records, after the trainer's own in the run's records file."""
        self.files.append_records(records)

    def _checkpoint_step(self) -> int | None:
        return self.files.checkpoint_step()

    def _stderr_size(self) -> int:
        try:
            return self.files.stderr_size()
        except Exception:  # its host is gone
            return 0

    def _notify(self, change: Change) -> None:
        if change.state in ENDED:
            try:  # what held the run where it trained (a Ray node's actor) goes
                self.executor.release(self.launch.run_dir)
            except Exception:
                log.exception("releasing %s failed", self.launch.run_dir)
        try:
            self._on_change(change)
        except Exception:
            log.exception("on_change callback of %s failed", self.launch.run_dir)
