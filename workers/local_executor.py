"""The local executor: each trainer a subprocess on this machine (the default).

    executor = LocalExecutor()                                   # exec every start
    executor = LocalExecutor(WarmTrainers(keep_children=True))   # fork the built-in trainer
    proc = executor.start(launch, env, require_checkpoint=False)
    executor.files(launch.run_dir).checkpoint_step()

The run dir is the server's own copy: the trainer writes its records there itself, so
there is nothing to ship. How the protocols read: workers/executor.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crashdrill.trainer.checkpoint_layout import ckpt_root
from crashdrill.workers.executor import ClusterView, Host, Trainer, this_host
from crashdrill.workers.mirror_restore import MirrorPull, pull_for_restart
from crashdrill.workers.rank_crash import RankTarget, kill_rank
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.trainer_process import TrainerProcess, adopt_trainer
from crashdrill.workers.warm import NONE, WarmTrainers, forkable

if TYPE_CHECKING:
    from crashdrill.workers.launch import Launch


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


class LocalRunFiles:
    """The server's copy of the run dir, which is also where the trainer runs."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = RunDir(run_dir)

    def checkpoint_step(self) -> int | None:
        return self.run_dir.latest_checkpoint_step()

    def wipe(self) -> None:
        shutil.rmtree(ckpt_root(self.run_dir.path), ignore_errors=True)

    def pull_from_mirror(self, url: str, segment: int) -> MirrorPull:
        return pull_for_restart(url, self.run_dir.path, segment)

    def append_records(self, records: list[dict[str, Any]]) -> None:
        self.run_dir.append_records(records)

    def stderr_size(self) -> int:
        return self.run_dir.stderr_size()

    def stderr_since(self, offset: int) -> bytes:
        return self.run_dir.stderr_since(offset)

    def stderr_tail(self, since: int) -> str:
        return self.run_dir.stderr_tail(since=since)

    def kill_rank(self, launcher: int) -> RankTarget:
        return kill_rank(self.run_dir, launcher)


class LocalExecutor:
    """Subprocesses on this machine, their run dir the server's own (the default). With
    `warm`, the built-in trainer is forked from a warm process that imported torch once
    (workers/warm.py); it keeps its trainers when it exits, so that they outlive a server
    that is killed and the next one adopts them."""

    name = "local"
    cluster: ClusterView | None = None  # one machine: always reachable, sampled by the server

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

    def files(self, run_dir: Path) -> LocalRunFiles:
        return LocalRunFiles(run_dir)

    def host(self, run_dir: Path) -> Host | None:
        return this_host()

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
            return {
                "mode": "exec",
                "warm": NONE,
                "pid": None,
                "forked": 0,
                "exec": 0,
                "error": None,
            }
        return self.warm.status()

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()


class LocalSettings(Protocol):
    """What the local executor reads of the lab's settings."""

    @property
    def trainer_command(self) -> tuple[str, ...]: ...


def from_settings(settings: LocalSettings) -> LocalExecutor:
    """The lab's local executor: the built-in trainer forks from a warm process
    (CRASHDRILL_WARM_TRAINERS=0: exec); trainers outlive the server as exec'd ones do, for
    the next one to adopt."""
    enabled = forkable(settings.trainer_command)
    return LocalExecutor(WarmTrainers(keep_children=True, enabled=enabled))
