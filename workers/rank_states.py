"""Each rank's state in a run of several ranks, the one home of the words: what the lab
shows on a run card (one chip per rank) and serves in a run's view (`ranks`).

    rank_states(run_dir, "running", "train", trainer_pid=4242, world=2)
    # [RankStatus(rank=0, state="training", pid=4250), RankStatus(rank=1, state="lost",
    #  pid=4251, at=1765012345.2)]

Nothing new is written for it: the state is read from what the workers already keep.

- The run's own state and stage (the supervisor's reports, the trainer's stage records):
  before the group trains every rank is `starting`; while the supervisor restarts the
  run every rank is `restarting`; once the run is over every rank ended with it
  (`finished`, `stopped`, or `failed` for a failed or diverged run).
- The run dir's ranks file (trainer/ranks.py; run_files.RANKS_FILE), written by the
  group's launcher, which is the run's trainer process: each rank's pid, and `lost` (which
  rank, when its launcher noticed, and for a blind launcher the deadline of the survivors'
  collective). A file written by an earlier trainer (the pid differs) says only which rank
  that group lost, shown until the restarted group writes its own. A run that trains with
  no ranks file here (its run dir is on a cluster's node) shows every rank training.
- Process liveness: a rank whose process is gone (or a zombie, or no longer the launcher's
  child) before its launcher wrote so is `lost` already, without the time. Only where the
  pids are this machine's: a cluster node's file (shipped by workers/ray_executor.py, its
  `hostname` another) is taken as it says.

The restart event a lost rank causes names it too (workers/rank_crash.py's fields, in the
run's log); this is the state of the moment.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from crashdrill.trainer.ranks import read_ranks_file
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.trainer.stages import Stage
from crashdrill.workers.rank_crash import pids_are_here


class RankState(StrEnum):
    """A rank's state; the value is what the API serves and the page shows."""

    STARTING = "starting"  # the group is not training yet (queued, forked, building)
    TRAINING = "training"
    LOST = "lost"  # its process ended with a failure, or was killed
    WAITING = "waiting"  # a blind launcher's survivor, in its collective until the timeout
    RESTARTING = "restarting"  # the group is down; the supervisor restarts it
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


# The run's ended states (workers/launch.py ENDED) as its ranks' states.
_ENDED = {
    "finished": RankState.FINISHED,
    "stopped": RankState.STOPPED,
    "failed": RankState.FAILED,
    "diverged": RankState.FAILED,
}


@dataclass(frozen=True)
class RankStatus:
    rank: int
    state: RankState
    pid: int | None = None  # the rank's process (null before its group forked it)
    at: float | None = None  # lost: when its launcher noticed (seconds since the epoch)
    until: float | None = None  # waiting: when the survivors' collective times out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d


def rank_states_json() -> list[str]:
    """Every rank state, as GET /api/record-kinds serves them (`rank_states`)."""
    return [s.value for s in RankState]


def _child_alive(pid: int, launcher: int) -> bool:
    """`pid` is a live (not zombie) child of `launcher`."""
    try:
        proc = psutil.Process(pid)
        return proc.ppid() == launcher and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def rank_states(
    run_dir: Path | None,
    run_state: str,
    stage: str | None,
    *,
    trainer_pid: int | None,
    world: int,
) -> list[RankStatus]:
    """Every rank's state now (see the module's docstring for where each comes from)."""
    said = read_ranks_file(run_dir / RANKS_FILE) if run_dir is not None else None
    return states_said(said, run_state, stage, trainer_pid=trainer_pid, world=world)


def states_said(
    said: dict[str, Any] | None,
    run_state: str,
    stage: str | None,
    *,
    trainer_pid: int | None,
    world: int,
) -> list[RankStatus]:
    """rank_states from the ranks file as read already (`said`; None: none)."""
    current = said is not None and trainer_pid is not None and said.get("launcher") == trainer_pid
    if current:  # an earlier group's file may be of another world size (a resharded resume)
        world = int(said.get("world") or world)  # type: ignore[union-attr]
    ranks = range(world)
    if run_state in _ENDED:
        return [RankStatus(r, _ENDED[run_state]) for r in ranks]
    lost: dict[str, Any] = (said or {}).get("lost") or {}
    lost_rank = lost.get("rank")
    pids: dict[str, Any] = (said or {}).get("pids") or {}
    if not current:
        # No group of this trainer yet: restarting (naming the rank the last group lost,
        # if it said one, until the new group writes its own file: the supervisor's
        # restart is back to "running" well before the new group has forked) or starting.
        out = []
        for r in ranks:
            if r == lost_rank and run_state in ("restarting", "running"):
                out.append(RankStatus(r, RankState.LOST, at=lost.get("noticed_at")))
            elif run_state == "restarting" or (lost_rank is not None and run_state == "running"):
                out.append(RankStatus(r, RankState.RESTARTING))
            elif said is None and run_state == "running" and stage == Stage.TRAIN:
                # It trains, and no ranks file is here to say more (a cluster node's run
                # dir): the group as a whole.
                out.append(RankStatus(r, RankState.TRAINING))
            else:
                out.append(RankStatus(r, RankState.STARTING))
        return out
    launcher = int(said["launcher"])  # type: ignore[index]
    here = pids_are_here(said or {})
    waiting = lost.get("launcher") == "blind" and "timed_out" not in lost
    out = []
    for r in ranks:
        pid = pids.get(str(r))
        pid = int(pid) if pid is not None else None
        if r == lost_rank:
            out.append(RankStatus(r, RankState.LOST, pid, at=lost.get("noticed_at")))
        elif pid is None or (here and not _child_alive(pid, launcher)):
            # Gone before its launcher said so: lost; after it lost another: taken down.
            gone = RankState.LOST if lost_rank is None else RankState.RESTARTING
            out.append(RankStatus(r, gone, pid))
        elif waiting:
            out.append(RankStatus(r, RankState.WAITING, pid, until=lost.get("deadline")))
        elif lost_rank is not None or run_state == "restarting":
            out.append(RankStatus(r, RankState.RESTARTING, pid))
        elif stage == Stage.TRAIN:
            out.append(RankStatus(r, RankState.TRAINING, pid))
        else:
            out.append(RankStatus(r, RankState.STARTING, pid))
    return out
