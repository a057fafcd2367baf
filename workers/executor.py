"""Where a run's trainer executes: the seam below the supervisor's policy.

    executor = LocalExecutor()                  # the default: subprocesses on this machine
    executor = LocalExecutor(WarmTrainers(keep_children=True))  # …forked from a warm process
    proc = executor.start(launch, env, require_checkpoint=False)
    proc.wait(0.2)        # exit status (None: unknown); TimeoutError while it runs
    proc.signal(SIGKILL)  # the trainer's whole process tree
    proc.lost_host        # None, or the host that vanished with the trainer (Ray)
    executor.wipe(run_dir)                      # delete its checkpoints where it runs
    executor.starts()                           # how trainers start: forked (warm) or exec
    executor.close()                            # the lab stops: let go of the warm process

The supervisor (workers/supervisor.py) decides when to restart, with which flags, and what
the events say; an executor only does what it is told, where the run lives. The server's
copy of the run dir (`launch.run_dir`) always holds records.jsonl and mirror.jsonl as the
ingest reads them: the local executor's trainer writes there itself; the Ray executor
(workers/ray_executor.py) ships the node's files there by offset while it waits, so
`wait` returning an exit status means every record the trainer wrote is in that copy.
Records the supervisor writes go through `append_records`, so that they land after the
trainer's own, in the file the trainer's restart appends to.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crashdrill.trainer.checkpoint_layout import ckpt_root
from crashdrill.workers.mirror_restore import MirrorPull, pull_for_restart
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.trainer_process import TrainerProcess, adopt_trainer
from crashdrill.workers.warm import WarmTrainers

if TYPE_CHECKING:
    from crashdrill.workers.launch import Launch


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


class Trainer(Protocol):
    """One started (or adopted) trainer process, wherever it runs."""

    pid: int
    started: float
    lost_host: Host | None  # set when the trainer's machine vanished (wait returns None)

    def wait(self, timeout: float) -> int | None: ...

    def signal(self, sig: int) -> None: ...


class Executor(Protocol):
    """What differs between running a trainer here and on a cluster node."""

    name: str

    def prepare(self, launch: Launch) -> None: ...

    def start(
        self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool
    ) -> Trainer: ...

    def adopt(self, run_dir: Path, pids: Iterable[int | None]) -> Trainer | None: ...

    def host(self, run_dir: Path) -> Host | None: ...

    def checkpoint_step(self, run_dir: Path) -> int | None: ...

    def wipe(self, run_dir: Path) -> None: ...

    def pull_from_mirror(self, run_dir: Path, url: str, segment: int) -> MirrorPull: ...

    def append_records(self, run_dir: Path, records: list[dict[str, Any]]) -> None: ...

    def stderr_size(self, run_dir: Path) -> int: ...

    def stderr_since(self, run_dir: Path, offset: int) -> bytes: ...

    def stderr_tail(self, run_dir: Path, since: int) -> str: ...

    def relocate(self, run_dir: Path) -> Host | None: ...

    def release(self, run_dir: Path) -> None: ...

    def cancel(self, run_dir: Path) -> None:
        """A Stop before the trainer exists: a start still waiting (for a node) gives up
        with StartCancelled; a start that comes later is not affected."""
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


class StartCancelled(OSError):
    """The run's start gave up because the run was stopped while it waited."""


class LocalTrainer:
    """A trainer on this machine: its host never vanishes while the server watches."""

    lost_host: Host | None = None

    def __init__(self, proc: TrainerProcess) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.started = proc.started

    def wait(self, timeout: float) -> int | None:
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        self.proc.signal(sig)


class LocalExecutor:
    """Subprocesses on this machine, their run dir the server's own (the default). With
    `warm`, the built-in trainer is forked from a warm process that imported torch once
    (workers/warm.py); it keeps its trainers when it exits, so that they outlive a server
    that is killed and the next one adopts them."""

    name = "local"

    def __init__(self, warm: WarmTrainers | None = None) -> None:
        self.warm = warm

    def prepare(self, launch: Launch) -> None:
        """Nothing to learn in advance: the trainer runs here, whatever it needs."""

    def start(self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool) -> Trainer:
        """Start the trainer in a session of its own, its output in the run dir's files;
        raises OSError when it cannot be started."""
        rd = RunDir(launch.run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        argv = launch.argv(require_checkpoint=require_checkpoint)
        with open(rd.stdout, "ab") as out, open(rd.stderr, "ab") as err:
            proc = TrainerProcess.start(argv, env, stdout=out, stderr=err, warm=self.warm)
        return LocalTrainer(proc)

    def adopt(self, run_dir: Path, pids: Iterable[int | None]) -> Trainer | None:
        proc = adopt_trainer(run_dir, pids)
        return LocalTrainer(proc) if proc is not None else None

    def host(self, run_dir: Path) -> Host | None:
        return this_host()

    def checkpoint_step(self, run_dir: Path) -> int | None:
        return RunDir(run_dir).latest_checkpoint_step()

    def wipe(self, run_dir: Path) -> None:
        shutil.rmtree(ckpt_root(run_dir), ignore_errors=True)

    def pull_from_mirror(self, run_dir: Path, url: str, segment: int) -> MirrorPull:
        return pull_for_restart(url, run_dir, segment)

    def append_records(self, run_dir: Path, records: list[dict[str, Any]]) -> None:
        RunDir(run_dir).append_records(records)

    def stderr_size(self, run_dir: Path) -> int:
        return RunDir(run_dir).stderr_size()

    def stderr_since(self, run_dir: Path, offset: int) -> bytes:
        try:
            with open(RunDir(run_dir).stderr, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    def stderr_tail(self, run_dir: Path, since: int) -> str:
        return RunDir(run_dir).stderr_tail(since=since)

    def relocate(self, run_dir: Path) -> Host | None:
        """Move the run to another machine: there is none here (the caller says so)."""
        return None

    def cancel(self, run_dir: Path) -> None:
        """A local start never waits: nothing to give up."""

    def release(self, run_dir: Path) -> None:
        """The run ended: nothing is held for it here."""

    def open(self) -> None:
        if self.warm is not None:
            self.warm.prewarm()

    def starts(self) -> dict[str, Any]:
        if self.warm is None:
            return {"mode": "exec", "pid": None, "forked": 0, "exec": 0, "error": None}
        return self.warm.status()

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()
