"""The `--kill-rank` trial: SIGKILL one rank's process, not the launcher, and watch what
the launcher does.

    pid = rank_pid(launcher_pid, 1)          # the worker whose environment says RANK=1
    watch = RankKill(rank=1, pid=pid, step=9, t=time.monotonic())
    watch.poll(launcher_pid, now)            # True once a new RANK=1 worker runs: restarted
    watch.launcher, watch.words()            # "restarted", "exited", "hung"

Which process is rank R: torch's launcher contract gives every worker its rank in the
environment (`RANK`, with `LOCAL_RANK` and `WORLD_SIZE`: torchrun, `torch.distributed.run`,
`torch.multiprocessing` scripts that follow it, Ray Train's workers), so the drill walks the
launcher's descendants and takes the topmost one whose environment has `RANK=R` (a
worker's own children, such as DataLoader workers, inherit it). What the launcher did:

- `restarted`: a new process with `RANK=R` appeared (torchrun `--max-restarts N` stops the
  surviving workers and starts the group again, which resumes from the checkpoint);
- `exited`: the launcher ended by itself (torchrun without restarts: the survivors are
  stopped and torchrun exits 1 with a ChildFailedError); the drill restarts it as after
  any kill;
- `hung`: neither, within the process's `--timeout` (a launcher that does not watch its
  ranks leaves the survivors blocked in their next collective).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

POLL_SECONDS = 0.1  # how often the launcher's tree is walked for a restarted rank
# torchrun shares its rendezvous TCP store with the workers and keeps it across the group's
# restarts: a restarted rank can read the killed group's addresses there and dial ports
# nobody listens on (pytorch/pytorch#135712). This opts out: each restart gets a store.
OWN_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
PEER_UNREACHABLE = ("connectFullMesh failed", "Connection refused")  # gloo's words for it


def stale_store_hint(lines: Iterable[str], environ: Mapping[str, str]) -> str | None:
    """Why a group the launcher restarted failed to connect its ranks, when its stderr
    says a rank dialed a peer nobody listened for and the store was shared; else None."""
    if environ.get(OWN_STORE_ENV) == "1":
        return None
    said = next((ln.strip() for ln in lines if any(p in ln for p in PEER_UNREACHABLE)), None)
    if said is None:
        return None
    return (
        f"the launcher's restarted group could not connect its ranks ({said[:160]}): "
        "torchrun keeps its rendezvous store across the group's restarts and a restarted "
        "rank can read the killed group's addresses there (pytorch/pytorch#135712); run the "
        f"launcher with {OWN_STORE_ENV}=1 to give each restart a store of its own"
    )


def rank_pid(root: int, rank: int) -> int | None:
    """The pid of the process of `rank` under `root` (the launcher): the topmost
    descendant whose environment says RANK=rank; None when there is none (yet)."""
    try:
        procs = psutil.Process(root).children(recursive=True)
    except (psutil.Error, ValueError):  # gone, or not a pid
        return None
    ranked: dict[int, int] = {}  # pid → parent pid, of the processes with RANK=rank
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.environ().get("RANK") == str(rank) and p.status() != psutil.STATUS_ZOMBIE:
                ranked[p.pid] = p.ppid()
    top = [pid for pid, parent in ranked.items() if parent not in ranked]
    return min(top) if top else None


def kill_rank(root: int, rank: int) -> int | None:
    """SIGKILL the process of `rank` under `root`, only that one: its pid, or None when
    no process has that rank."""
    pid = rank_pid(root, rank)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pid


@dataclass
class RankKill:
    """One rank's SIGKILL and what the launcher did after it."""

    rank: int
    pid: int | None  # None: no process of that rank was found (the kill did not land)
    step: int | None  # the last step line read before the kill
    t: float  # time.monotonic() of the SIGKILL
    launcher: str = ""  # "restarted", "exited", "hung" ("" while it is still watched)
    seconds: float | None = None  # from the SIGKILL to the launcher's restart or exit
    exit_code: int | None = None  # the launcher's, when it exited
    first_step_s: float | None = None  # restarted: SIGKILL → the new group's first step line
    _next_poll: float = 0.0

    def poll(self, root: int, now: float) -> bool:
        """Walk the launcher's tree (every POLL_SECONDS): True once a new process of the
        rank runs, the group restarted."""
        if self.launcher or now < self._next_poll or self.pid is None:
            return False
        self._next_poll = now + POLL_SECONDS
        pid = rank_pid(root, self.rank)
        if pid is None or pid == self.pid:
            return False
        self.launcher, self.seconds = "restarted", now - self.t
        return True

    def ended(self, exit_code: int | None, now: float, hung: bool) -> None:
        """The launcher's process ended (or the drill stopped it at its timeout)."""
        if self.launcher:
            return
        self.launcher = "hung" if hung else "exited"
        self.seconds = now - self.t
        self.exit_code = None if hung else exit_code

    def words(self) -> str:
        """What the launcher did, in a sentence."""
        who = f"rank {self.rank} (pid {self.pid}) was SIGKILLed after step {self.step}"
        if self.pid is None:
            return (
                f"no process with RANK={self.rank} was found under the launcher at step "
                f"{self.step}: the drill killed the whole process tree instead"
            )
        s = f"{self.seconds:.2f} s" if self.seconds is not None else "?"
        if self.launcher == "restarted":
            first = (
                f", its first step line {self.first_step_s:.2f} s after the kill"
                if self.first_step_s is not None
                else ", and printed no step line"
            )
            return f"{who}; the launcher restarted the group {s} later{first}"
        if self.launcher == "exited":
            return (
                f"{who}; the launcher exited (status {self.exit_code}) {s} later, and the "
                "drill restarted it"
            )
        return (
            f"{who}; the launcher neither restarted the group nor exited: it hung {s} until "
            "the drill's --timeout stopped it (its surviving ranks waited in a collective)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "step": self.step,
            "launcher": self.launcher or None,
            "seconds": round(self.seconds, 3) if self.seconds is not None else None,
            "exit_code": self.exit_code,
            "first_step_s": round(self.first_step_s, 3) if self.first_step_s is not None else None,
        }
