"""Crash mode `rank` (a mode that kills `one_rank`, trainer/crash_modes.py): which process
of a run's group is the rank to kill, and what its launcher said of the loss.

    target = rank_target(run_dir, launcher_pid)   # RankTarget(rank=1, pid=…, world=2)
    target.kill()                                 # SIGKILL of that rank alone; when it was sent
    kill_rank(run_dir, launcher_pid)              # both, where the group runs (RunFiles)
    lost_rank_fields(run_dir, target)             # {"lost_rank": 1, "noticed_s": 0.004}
    rank_lead(target, fields, step)               # "Crash test: killed rank 1 of 2 (pid …) …"

The ranks' pids come from the run dir's ranks file, which the group's launcher writes once
every rank is forked (trainer/ranks.py); a rank is killed only while it is still a child
of the launcher the supervisor watches (a file left by an earlier group, or a pid that was
reused, is never signalled). A one-rank run, or a group that has not forked its ranks yet,
is refused with RankCrashRefused, which says which and what to do.
"""

from __future__ import annotations

import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

import psutil

from crashdrill.trainer.ranks import read_ranks_file
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.launch import NotRunning
from crashdrill.workers.run_dir import RunDir


class RankCrashRefused(NotRunning):
    """A rank crash that cannot be done on this run now; the message says why."""


@dataclass
class RankTarget:
    rank: int
    pid: int
    world: int
    proc: psutil.Process | None = None  # None: killed where it ran (a cluster node)
    killed_at: float | None = None  # time.time() of the SIGKILL

    def to_dict(self) -> dict[str, Any]:
        """What a node answers for the rank it killed (RankTarget.from_dict on the server)."""
        return {k: v for k, v in vars(self).items() if k != "proc"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankTarget:
        killed = d.get("killed_at")
        return cls(int(d["rank"]), int(d["pid"]), int(d["world"]), None, killed)

    def kill(self, settle_s: float = 0.2) -> None:
        """SIGKILL this rank (psutil checks the pid is still the same process), and wait
        until it is dead (gone, or a zombie its launcher has not reaped), at most
        `settle_s`: what the lab says of the run right after the kill (its view's `ranks`)
        then sees the rank lost, not a process the signal has not reached yet."""
        if self.proc is None:
            raise RankCrashRefused(f"rank {self.rank} runs on another machine")
        sent = time.time()  # before: its launcher may notice before this returns
        try:
            self.proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            raise RankCrashRefused(f"rank {self.rank} has already exited") from None
        self.killed_at = sent
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            try:
                if self.proc.status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            time.sleep(0.002)


class RankElsewhere(RankCrashRefused):
    """The rank to kill is started by another node's launcher of the same group."""


def rank_target(run_dir: RunDir, launcher: int) -> RankTarget:
    """The rank a rank crash kills in the group that `launcher` (the run's trainer
    process) started."""
    said = read_ranks_file(run_dir.path / RANKS_FILE)
    if said is None or said.get("launcher") != launcher:
        ranks = (run_dir.run_json().get("config") or {}).get("ranks", 1)
        if ranks == 1:
            raise RankCrashRefused(
                "crash mode 'rank' kills one rank of a run with several ranks, and this run "
                "has one (ranks = 1): set ranks = 2 or more, or use another crash mode"
            )
        raise RankCrashRefused("its ranks are not started yet; press again in a moment")
    rank = int(said["crash_rank"])
    if str(rank) not in said["pids"]:  # a group spread over nodes: another node's launcher
        raise RankElsewhere(f"rank {rank} is not one of this node's ranks")
    pid = int(said["pids"][str(rank)])
    try:
        proc = psutil.Process(pid)
        alive = proc.ppid() == launcher and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    if not alive:
        raise RankCrashRefused(f"rank {rank} (pid {pid}) has already exited")
    return RankTarget(rank, pid, int(said["world"]), proc)


def kill_rank(run_dir: RunDir, launcher: int) -> RankTarget:
    """Kill the rank a rank crash kills in `launcher`'s group, on the machine the group
    runs on (RunFiles.kill_rank: the server's, or a cluster node's through its actor)."""
    target = rank_target(run_dir, launcher)
    target.kill()
    return target


def pids_are_here(said: dict[str, Any]) -> bool:
    """The ranks file's pids are this machine's (its launcher wrote its hostname, or is
    older than the field): only then may they be read or signalled here."""
    host = said.get("hostname")
    return host is None or host == socket.gethostname()


def lost_rank_fields(run_dir: RunDir, target: RankTarget) -> dict[str, Any]:
    """The crash event's fields: the rank killed, and how long its launcher took to see it
    lost (None: the launcher wrote nothing of it, or of another rank first)."""
    lost = (read_ranks_file(run_dir.path / RANKS_FILE) or {}).get("lost") or {}
    noticed = None
    if lost.get("rank") == target.rank and target.killed_at is not None:
        noticed = round(max(0.0, float(lost["noticed_at"]) - target.killed_at), 4)
    return {"lost_rank": target.rank, "noticed_s": noticed}


def blind_wait(run_dir: RunDir) -> float | None:
    """Seconds the survivors of a blind launcher's group (launcher = "blind") waited for the
    lost rank until their collective timed out (None: a launcher that watches, or no
    timeout said)."""
    lost = (read_ranks_file(run_dir.path / RANKS_FILE) or {}).get("lost") or {}
    timed_out = lost.get("timed_out") or {}
    if lost.get("launcher") != "blind" or "at" not in timed_out:
        return None
    return round(float(timed_out["at"]) - float(lost["noticed_at"]), 3)


def rank_lead(
    target: RankTarget, fields: dict[str, Any], step: int | None, waited_s: float | None = None
) -> str:
    """The crash event's first sentence: the rank killed, where, and its launcher
    (`waited_s`: a blind launcher's survivors waited that long for their timeout)."""
    at = f" at step {step}" if step is not None else ""
    noticed = fields["noticed_s"]
    if waited_s is not None:
        return (
            f"Crash test: killed rank {target.rank} of {target.world} (pid {target.pid}) with"
            f" SIGKILL{at}; its launcher does not watch its ranks, so the others waited"
            f" {waited_s:.1f} s in their collective until it timed out and the group ended"
        )
    seen = (
        f"; its launcher noticed in {noticed * 1000:.0f} ms and took the group down"
        if noticed is not None
        else "; its launcher took the group down"
    )
    return (
        f"Crash test: killed rank {target.rank} of {target.world} (pid {target.pid}) with"
        f" SIGKILL{at}{seen}"
    )
