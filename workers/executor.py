"""Where a run's trainer executes: the seam below the supervisor's policy.

    executor = LocalExecutor()          # workers/local_executor.py: subprocesses here
    executor = create_executor(settings)    # by name (workers/executor_registry.py)
    proc = executor.start(launch, env, require_checkpoint=False)
    proc.wait(0.2)        # exit status (None: unknown); TimeoutError while it runs
    proc.signal(SIGKILL)  # the trainer's whole process tree
    proc.lost_host        # None, or the host that vanished with the trainer (Ray)
    files = executor.files(run_dir)     # the run dir where the trainer runs (RunFiles)
    files.checkpoint_step(); files.wipe(); files.append_records([...])
    executor.cluster      # None, or the nodes' health and telemetry (ClusterView)

Three protocols, one job each:

- `Executor`: process control. Place a run (`prepare`, `start`, `relocate`), find it again
  after a server restart (`adopt`), give up a start that waits (`cancel`), let go of it
  (`release`), say where it runs (`host`) and how trainers start (`starts`).
- `Trainer`: one started or adopted trainer: `wait` (which also ships its records) and
  `signal` (its whole process tree).
- `RunFiles`: the run dir *where the trainer runs* (this machine's, or a node's disk):
  its checkpoints, the records the supervisor appends after the trainer's own, its stderr.

The server's copy of the run dir (`launch.run_dir`) always holds records.jsonl and
mirror.jsonl as the ingest reads them: the local executor's trainer writes there itself;
the Ray executor ships the node's files there by offset while it waits, so `wait`
returning an exit status means every record the trainer wrote is in that copy.
Records the supervisor writes go through `RunFiles.append_records`, so that they land
after the trainer's own, in the file the trainer's restart appends to.

What only some executors have is a typed, optional attribute, never a getattr: `cluster`
(a `ClusterView`: reachability, the nodes' own telemetry, which runs a node holds) is None
on the local executor. The supervisor (workers/supervisor.py) decides when to restart,
with which flags, and what the events say; an executor only does what it is told.
Writing a new executor: docs/cluster.md "Writing an executor".
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from crashdrill.workers.cluster_health import ClusterHealth
    from crashdrill.workers.launch import Launch
    from crashdrill.workers.mirror_restore import MirrorPull
    from crashdrill.workers.rank_crash import RankTarget


@dataclass(frozen=True)
class Host:
    """The machine a run trains on: a Ray node id (the hostname on the local executor)."""

    node_id: str
    name: str

    def to_dict(self) -> dict[str, str]:
        return {"node_id": self.node_id, "name": self.name}


def this_host() -> Host:
    name = socket.gethostname()
    return Host(node_id=name, name=name)


class StartCancelled(OSError):
    """The run's start gave up because the run was stopped while it waited."""


class ExecutorError(OSError):
    """The executor cannot do what was asked (a cluster unreachable, no node with the
    resources); the message says which and where."""


class NoRoomForRanks(ExecutorError):
    """A run of several ranks must move and no node left has room for its whole group;
    `fits`: the most ranks a node has room for now (0: not one)."""

    def __init__(self, message: str, *, ranks: int, fits: int) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.fits = fits


class Trainer(Protocol):
    """One started (or adopted) trainer process, wherever it runs."""

    pid: int
    started: float
    lost_host: Host | None  # set when the trainer's machine vanished (wait returns None)

    def wait(self, timeout: float) -> int | None:
        """The exit status once it ended and all its records are in the server's copy
        (None: unknown, or its host was lost); TimeoutError while it runs."""
        ...

    def signal(self, sig: int) -> None:
        """To the trainer's whole process tree; ProcessLookupError when it is gone."""
        ...


class RunFiles(Protocol):
    """The run dir where the trainer runs: this machine's, or a node's own disk."""

    def checkpoint_step(self) -> int | None:
        """Step of the newest checkpoint whose manifest names it (None: none)."""
        ...

    def wipe(self) -> None:
        """Delete the run's checkpoints there (crash modes wipe and host)."""
        ...

    def pull_from_mirror(self, url: str, segment: int) -> MirrorPull:
        """Restore the newest verified checkpoint from the mirror at `url` there."""
        ...

    def append_records(self, records: list[dict[str, Any]]) -> None:
        """After the trainer's own lines, as complete lines, reaching the server's copy."""
        ...

    def stderr_size(self) -> int: ...

    def stderr_since(self, offset: int) -> bytes:
        """The trainer's stderr from byte `offset` (b"": nothing, or not readable now)."""
        ...

    def stderr_tail(self, since: int) -> str:
        """Its last non-blank stderr lines after byte `since` (a failure's detail)."""
        ...

    def kill_rank(self, launcher: int) -> RankTarget:
        """SIGKILL the rank a rank crash kills in the group of `launcher` (the trainer's
        pid there), where the group runs; RankCrashRefused says why it cannot."""
        ...


class ClusterView(Protocol):
    """What an executor on a cluster of nodes tells the lab beyond its runs."""

    health: ClusterHealth  # whether the cluster answers (GET /api/health's `cluster`)
    # What a node samples of itself ({"interval_s", "price_per_kwh", "rent_per_hour"});
    # None: nodes sample nothing. Each sample goes to `on_node_sample`.
    telemetry: dict[str, float] | None
    on_node_sample: Callable[[dict[str, Any]], None] | None

    def runs_on(self, node_id: str) -> list[str]:
        """The runs (their run dirs' names) placed on that node now."""
        ...


class Executor(Protocol):
    """What differs between running a trainer here and on a cluster node."""

    name: str  # its name in the registry (workers/executor_registry.py)

    @property
    def cluster(self) -> ClusterView | None:
        """The cluster its runs train on (reachability, nodes' telemetry); None: one
        machine, always reachable, sampled by the server itself."""
        ...

    def prepare(self, launch: Launch) -> None:
        """Learn what the run needs (its resources) before anything is placed."""
        ...

    def start(self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool) -> Trainer:
        """Start the trainer in a session of its own; OSError when it cannot start
        (StartCancelled: the run was stopped while the start waited)."""
        ...

    def adopt(self, run_dir: Path, pids: Iterable[int | None]) -> Trainer | None:
        """The run's trainer that is still alive (a server restarted), or None."""
        ...

    def files(self, run_dir: Path) -> RunFiles:
        """The run dir where the run's trainer runs (see RunFiles)."""
        ...

    def host(self, run_dir: Path) -> Host | None:
        """Where the run trains, or last trained (None: not placed)."""
        ...

    def relocate(self, run_dir: Path) -> Host | None:
        """Move the run to another machine (its trainer is dead); None: there is none."""
        ...

    def cancel(self, run_dir: Path) -> None:
        """A Stop before the trainer exists: a start still waiting (for a node) gives up
        with StartCancelled, and so does the run's next start that would wait (the Stop
        may come before the start begins to wait); `release` forgets it. A start that
        never waits (the local executor's) is not affected."""
        ...

    def release(self, run_dir: Path) -> None:
        """The run ended: what is held for it goes (its last records shipped first)."""
        ...

    def open(self) -> None:
        """The lab starts: get ready for the first start (a warm process begins importing)."""
        ...

    def starts(self) -> dict[str, Any]:
        """How trainers start: {"mode": "fork" (a warm process) | "exec" | "node" (each
        machine's own), "error": why not warm, …} (GET /api/health)."""
        ...

    def close(self) -> None:
        """The lab stops: what the executor holds goes; running trainers keep running."""
        ...
