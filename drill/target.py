"""What the drill runs and what it saw of each process: the `Target` (a command, where its
checkpoints go, how it prints losses, what its exit statuses mean), the `Child` it starts,
and the `Segment`, one process of a run from its start to its exit or its kill.

    class MyTarget(Target): ...           # drill/builtin.py (presets), drill/command.py
    seg = run_segment(target, ckpt_dir, 0, None)   # drill/engine.py fills a Segment
    seg.points, seg.killed, seg.exit_code, seg.snapshot_before_kill

The engine (drill/engine.py) starts, follows and kills the processes; the comparison
(drill/compare.py) reads the segments.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from crashdrill.drill.checkpoint_files import CheckpointFiles
from crashdrill.drill.diverged import Divergence
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.rank_kill import RankKill
from crashdrill.drill.snapshot import Snapshot, final_names, scan
from crashdrill.drill.trace import LossParser, StepPoint


class StartError(RuntimeError):
    """The command could not be started at all (not found, not executable)."""


class Child(Protocol):
    """A started process, exec'd (ExecProcess) or forked by the fork server
    (crashdrill/processes/forkserver.py): its pid leads its own process group."""

    pid: int
    stdout: IO[bytes]
    stderr: IO[bytes]
    cpu_s: float | None  # user + system CPU seconds, once it has ended

    def poll(self) -> int | None:
        """The exit status once it has ended (negative: killed by that signal), else None."""
        ...

    def wait(self) -> int: ...


class ExecProcess:
    """A process started with exec (subprocess.Popen), reaped with wait4 for its CPU time."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        try:
            self._popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: killpg reaches its children
            )
        except OSError as e:
            raise StartError(f"cannot start {argv[0]!r}: {e.strerror or e}") from None
        assert self._popen.stdout is not None and self._popen.stderr is not None
        self.pid = self._popen.pid
        self.stdout: IO[bytes] = self._popen.stdout
        self.stderr: IO[bytes] = self._popen.stderr
        self.cpu_s: float | None = None

    def poll(self) -> int | None:
        return self._wait(os.WNOHANG)

    def wait(self) -> int:
        code = self._wait(0)
        assert code is not None
        return code

    def _wait(self, flags: int) -> int | None:
        if self._popen.returncode is None:
            pid, status, usage = os.wait4(self.pid, flags)
            if not pid:
                return None
            self._popen.returncode = os.waitstatus_to_exitcode(status)  # Popen won't reap it
            self.cpu_s = usage.ru_utime + usage.ru_stime
        return self._popen.returncode


class WriteWatch:
    """Tells the engine when a checkpoint write is under way, so a kill can land in it."""

    interval = 0.05  # seconds between polls

    def on_step(self, step: int) -> None:
        """A step line was printed."""

    def on_stderr(self, line: str) -> bool:
        """True when this stderr line says a write is under way."""
        return False

    def poll(self) -> bool:
        """True when a write is under way now."""
        return False

    def snapshot_before(self) -> Snapshot | None:
        """The checkpoint dir as it was before the write began (None: take it at the kill)."""
        return None

    def shows_state_before(self, step: int) -> bool:
        """The step line `step` (just read) shows the dir as the write the kill is aimed
        at will find it: a copy taken now is what a recovery puts back (drill/engine.py)."""
        return False


class Target:
    """What the drill runs: a command, where its checkpoints go, how it prints losses."""

    parser: LossParser
    timeout: float
    # Whose output the steps are read from (drill/rank_output.py): one rank's, or None:
    # every rank's, rank 0's as the run's trace and each rank's in Segment.rank_points.
    rank: int | None = None
    # Which files of the checkpoint dir are checkpoints (None: every file, a dir that
    # holds nothing else by contract); what it took and ignored goes in the report.
    files: CheckpointFiles | None = None
    # The whole drill's deadline (time.monotonic()): a process still running then is
    # stopped and the drill reports what it saw, marked incomplete (None: no deadline).
    deadline: float | None = None

    def command(self, ckpt_dir: Path, restart: bool) -> list[str]:
        raise NotImplementedError

    def gets_resume_args(self, ckpt_dir: Path, restart: bool) -> bool | None:
        """Whether command() adds the resume arguments now (None: the target has none)."""
        return None

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None) -> Child:
        """Start one process of the run (StartError when it cannot start at all)."""
        return ExecProcess(argv, env, cwd)

    def environ(self, ckpt_dir: Path, kill: KillPoint | None) -> dict[str, str]:
        raise NotImplementedError

    def checkpoint_root(self, ckpt_dir: Path) -> Path:
        """The folder the checkpoints live in."""
        return ckpt_dir

    def snapshot(self, ckpt_dir: Path) -> Snapshot:
        """The checkpoint files (and temp files of a write) in the checkpoint dir."""
        root = self.checkpoint_root(ckpt_dir)
        return self.files.scan(root) if self.files is not None else scan(root)

    def has_checkpoint(self, snap: Snapshot | None) -> bool:
        return bool(snap)

    def advanced(self, before: Snapshot | None, after: Snapshot | None) -> bool:
        """Does `after` hold a checkpoint that `before` did not? A temp file of a write
        under way is not one yet, nor a JSON checkpoint rewritten with the step it held
        (drill/checkpoint_files.py)."""
        if self.files is not None:
            return self.has_checkpoint(after) and self.files.advanced(before, after)
        return self.has_checkpoint(after) and finals(after) != finals(before)

    def progress_saved(self, baseline: Snapshot | None, before_kill: Snapshot | None) -> bool:
        """Did a checkpoint newer than the start exist when the kill landed?"""
        return self.advanced(baseline, before_kill)

    def write_watch(self, ckpt_dir: Path, kill: KillPoint) -> WriteWatch:
        raise NotImplementedError

    def exit_meaning(self, code: int | None) -> str | None:
        """What an exit status means, when the target documents it."""
        return None

    def resumed_from(self, segment: Segment) -> int | None:
        """The step a restarted process says it resumed from, when it says so."""
        return None

    def diverged(self, segment: Segment) -> Divergence | None:
        """Where the process stopped because its loss or gradient norm was not finite,
        when the target documents such an exit (drill/diverged.py)."""
        return None

    def refused(self, segment: Segment) -> bool:
        """The process exited saying it will not resume this way (a restart on another
        world size: drill/world_size.py): a refusal ends the chain, it is never replayed."""
        return False

    def failure_hint(self, segment: Segment) -> str | None:
        """A likely cause of a process that failed by itself, when the target sees one
        (a command run by another interpreter than crashdrill's: drill/command.py)."""
        return None

    @property
    def cwd(self) -> str | None:
        return None

    def describe(self) -> dict[str, object]:
        return {}


@dataclass
class Segment:
    """One process of a run, from its start to its exit or its kill."""

    index: int
    argv: list[str]
    kill_point: KillPoint | None
    started: float  # time.monotonic()
    points: list[StepPoint] = field(default_factory=list)
    # A script whose lines say their rank (torchrun's prefixes, a JSON "rank"): each
    # rank's own steps, rank 0's too (drill/rank_output.py); empty when none says one.
    rank_points: dict[int, list[StepPoint]] = field(default_factory=dict)
    ended: float = 0.0
    exit_code: int | None = None
    killed: bool = False  # by the plan (not by a timeout)
    kill_time: float | None = None
    hung: bool = False
    stderr_head: list[str] = field(default_factory=list)  # the first lines (the loud one)
    stderr_tail: list[str] = field(default_factory=list)
    stderr_lines: int = 0
    other_stdout: list[str] = field(default_factory=list)  # a few lines that were not steps
    snapshot_first_step: Snapshot | None = None
    snapshot_before_kill: Snapshot | None = None
    snapshot_after_kill: Snapshot | None = None  # once the process is dead
    first_ckpt_step: int | None = None  # reference only: the step before the first write
    write_steps: list[int] = field(default_factory=list)  # reference: each step before a write
    # reference: what showed checkpoints written under their final names (write_evidence.py)
    writes_in_place: list[str] = field(default_factory=list)
    in_write: bool = False  # the kill landed inside a checkpoint write
    cpu_s: float | None = None  # user + system CPU seconds of the process
    resume_args: bool | None = None  # started with the target's resume arguments
    processes_killed: int | None = None  # by the plan's kill: the process and its tree
    term_time: float | None = None  # a preemption: when its SIGTERM went out
    grace_expired: bool = False  # a preemption that the SIGKILL after its grace ended
    # A copy of the checkpoint dir from before a kill that may damage it, for a recovery
    # restart: before a kill inside a write, the dir as that write found it, at the step
    # line `copy_step` (its snapshot `copy_snapshot`); before a preemption, as the segment
    # started (`copy_step` None).
    state_copy: Path | None = None
    copy_step: int | None = None
    copy_snapshot: Snapshot | None = None
    # This segment started from the copy taken in segment `restored_from`: it replays that
    # segment from the copy's step on, after the restart that followed a damaging kill failed.
    restored_from: int | None = None
    snapshot_start: Snapshot | None = None  # the checkpoint dir when it started (crashed run)
    out_of_drill_time: bool = False  # stopped by the whole drill's deadline (also `hung`)
    # --kill-rank: the rank whose process alone was SIGKILLed, and what the launcher did
    rank_kill: RankKill | None = None
    # The launcher restarted the group after the rank kill (time.monotonic()): the lines
    # read from then on are the restarted group's, a resume of its own (engine.py splits)
    group_restart_t: float | None = None
    launcher_restart: bool = False  # this segment is a group the launcher restarted itself
    # stderr lines that say a rank could not reach a peer (rank_kill.PEER_UNREACHABLE),
    # kept wherever they fall: a launcher's failure summary pushes them out of the tail
    peer_errors: list[str] = field(default_factory=list)
    # Why the drill started no restart after this segment although the run had not
    # finished: "no-progress", "same-failure", "restart-cap N", "deadline" (engine.py).
    chain_end: str | None = None

    @property
    def last_step(self) -> int | None:
        return self.points[-1].step if self.points else None

    @property
    def first_step(self) -> int | None:
        return self.points[0].step if self.points else None

    @property
    def crashed(self) -> bool:
        """Ended by itself with a failure: neither our kill, nor a timeout, nor success."""
        return not self.killed and not self.hung and self.exit_code not in (0, None)


def finals(snap: Snapshot | None) -> Snapshot:
    """The files of a snapshot under final names (not temp files): what a restart loads."""
    return {k: snap[k] for k in final_names(snap)} if snap else {}


def last_step_trained(segments: list[Segment]) -> int | None:
    """The step a chain of segments got to: the last step printed by the last segment that
    printed one. A restart after a stop that had already saved the final step resumes,
    finds nothing left to train and prints no step: the run still ended there."""
    return next((s.last_step for s in reversed(segments) if s.points), None)
