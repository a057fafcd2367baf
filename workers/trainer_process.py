"""A trainer process as the supervisor handles it: started in its own session, found
again after a server restart, waited for, signalled as a whole.

    proc = TrainerProcess.start(argv, env, stdout=out, stderr=err)   # our child
    proc = TrainerProcess.start(argv, env, stdout=out, stderr=err, warm=warm)  # forked
    proc = adopt_trainer(run_dir, [pid_from_db, pid_from_run_json])  # or None
    proc.wait(0.2)            # exit status; None when adopted; TimeoutError while alive
    proc.signal(SIGKILL)      # the trainer and everything it started (process_tree.kill_tree)
    proc.signal(SIGTERM)      # other signals go to its process group

The trainer runs in its own session with its output in files, not pipes: it outlives a
server that is killed, and a new server adopts it by pid, recognised by `--run-dir DIR` on
its command line (a recycled pid runs something else). `started` is the process's start
time, which the server stores beside the pid. Every process of a run carries the run dir
as its process-tree marker, so a SIGKILL also finds descendants that made a session of
their own or were re-parented (torchrun's ranks, a data loader's workers).

With `warm` (workers/warm.py) the built-in trainer is forked from the machine's warm
process instead of exec'd: the same command line, session, files and environment, its
exit status relayed by the warm process. Either way a trainer whose environment asks for
the lab's nice value (trainer/priority.py) yields the CPU from its first instruction: set
in the child right after the fork, or before the exec, never after its imports. A wait
blocks on the process's end (its status socket, or a pidfd), so the supervisor hears of a
death at once, not at its next poll.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

import psutil

from crashdrill.processes.cpu_priority import yield_cpu
from crashdrill.processes.forkserver import (
    ForkedProcess,
    ForkServerError,
    die_with_parent_process,
    readable,
)
from crashdrill.processes.process_tree import kill_tree, members, tree_marker
from crashdrill.trainer.priority import wanted_nice
from crashdrill.workers.warm import WarmTrainers


def _run_dir_of(argv: Iterable[str]) -> str | None:
    """The `--run-dir DIR` of a trainer's command line (its process-tree marker)."""
    for a, b in itertools.pairwise(argv):
        if a == "--run-dir":
            return b
    return None


class TrainerProcess:
    """A trainer process: our child or the warm process's (exit status known) or adopted
    (status unknown)."""

    def __init__(
        self,
        pid: int,
        popen: subprocess.Popen[bytes] | None = None,
        *,
        forked: ForkedProcess | None = None,
        argv: Iterable[str] | None = None,
    ) -> None:
        self.pid = pid
        self.popen = popen
        self.forked = forked
        self.ps: psutil.Process | None = None
        self.started = 0.0
        self.marker: str | None = None
        if popen is not None and isinstance(popen.args, list):
            argv = (str(a) for a in popen.args)
        if argv is not None:
            self.marker = _run_dir_of(argv)
        # What a SIGSTOP stopped (pid → start time), continued by the next SIGCONT whatever
        # happened to the tree in between (signal).
        self._stopped: dict[int, float] = {}
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # not Linux ≥ 5.3: polled waits
            self._pidfd = os.pidfd_open(pid)
        try:
            self.ps = psutil.Process(pid)
            self.started = self.ps.create_time()
            if self.marker is None:
                self.marker = _run_dir_of(self.ps.cmdline())
        except psutil.Error:
            if popen is None and forked is None:
                self.close()
                raise

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: Mapping[str, str],
        *,
        stdout: IO[bytes],
        stderr: IO[bytes],
        warm: WarmTrainers | None = None,
        die_with_parent: bool = False,
    ) -> TrainerProcess:
        """Start `argv` in a session of its own: forked from `warm` where it can, else
        exec'd (with `die_with_parent`, SIGKILLed when this process dies: a Ray actor's);
        raises OSError when it cannot be started."""
        run_dir = _run_dir_of(argv)
        env = {**env, **tree_marker(run_dir)} if run_dir else dict(env)
        nice = wanted_nice(env)  # the lab's: yield the CPU from the first instruction on
        if warm is not None:
            child = warm.spawn(argv, env, stdout=stdout, stderr=stderr, nice=nice)
            if child is not None:
                return cls(child.pid, forked=child, argv=argv)

        def before_exec() -> None:  # in the child, before its imports
            if die_with_parent:
                die_with_parent_process()
            if nice is not None:
                yield_cpu(nice)

        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,  # outlives the server; a crash kills its group
            preexec_fn=before_exec if die_with_parent or nice is not None else None,
        )
        return cls(popen.pid, popen)

    def _ended(self, timeout: float) -> bool:
        """Block until the process has ended or `timeout` passed (its pidfd)."""
        if self._pidfd is None:
            return True  # nothing to block on: the caller's own wait polls
        try:
            return readable(self._pidfd, timeout)
        except (OSError, ValueError):
            return True

    def wait(self, timeout: float) -> int | None:
        """Exit status (None when adopted, or when the warm process that relays it died);
        raises TimeoutError while it still runs."""
        if self.forked is not None:
            try:
                code = self.forked.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError from None
            except ForkServerError:  # its status is gone with the warm process: watch it
                self.forked = None
                return self.wait(timeout)
            self.close()
            return code
        if self.popen is not None:
            if self.popen.poll() is None and self._pidfd is not None:
                self._ended(timeout)
                if self.popen.poll() is None:
                    raise TimeoutError
            try:
                code = self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError from None
            self.close()
            return code
        if self.ps is None:
            return None
        if not self._ended(timeout):
            raise TimeoutError
        try:
            # An exited trainer whose new parent does not reap it stays a zombie, which
            # psutil's wait would take for alive forever.
            if self.ps.status() == psutil.STATUS_ZOMBIE:
                return None
            self.ps.wait(timeout)
        except psutil.TimeoutExpired:
            raise TimeoutError from None
        except psutil.NoSuchProcess:
            pass
        self.close()
        return None

    def close(self) -> None:
        """Let go of the pidfd (the process has ended, or nobody watches it any more)."""
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _exited(self) -> bool:
        if self.forked is not None:
            return self.forked.returncode is not None
        if self.popen is not None:
            return self.popen.returncode is not None
        return self.ps is None or not self.ps.is_running()

    def _continue_stopped(self) -> None:
        stopped, self._stopped = self._stopped, {}
        _continue_stopped_pids(stopped)

    def signal(self, sig: int) -> None:
        """SIGKILL: the trainer's whole process tree, whatever session or group each
        process made (see process_tree.kill_tree); SIGSTOP and SIGCONT (a hold,
        workers/hold.py) to every process of that tree too, so no rank trains on while the
        rest is held. A SIGCONT also continues every process the last SIGSTOP stopped that
        has left the tree since (a blind rank's keeper whose rank a crash test killed while
        held, re-parented away from the launcher), even when the trainer itself has ended:
        nothing this stopped is left stopped. Any other signal: its process group (it leads
        its own session). ProcessLookupError when it has ended."""
        if sig == signal.SIGCONT:
            self._continue_stopped()
        if self._exited():
            raise ProcessLookupError(self.pid)
        if sig == signal.SIGKILL:
            if kill_tree(self.pid, marker=self.marker) == 0:
                raise ProcessLookupError(self.pid)
            return
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            for p in members(self.pid, marker=self.marker):
                with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                    if sig == signal.SIGSTOP:
                        self._stopped.setdefault(p, psutil.Process(p).create_time())
                    os.kill(p, sig)
            return
        pgid = os.getpgid(self.pid)
        if pgid == self.pid:
            os.killpg(pgid, sig)
        else:
            os.kill(self.pid, sig)


def _continue_stopped_pids(stopped: dict[int, float]) -> None:
    """SIGCONT each of `stopped` (pid → start time) that is still the process it was."""
    for pid, started in stopped.items():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if psutil.Process(pid).create_time() == started:
                os.kill(pid, signal.SIGCONT)


def find_live_trainer(
    run_dir: Path, pids: Iterable[int | None], *, scan: bool = True
) -> int | None:
    """A live trainer of `run_dir`, recognised by `--run-dir DIR` on its command line:
    first among `pids` (known from the database and run.json), then, with `scan`, among
    all processes (one started just before a server died, before anyone wrote its pid).
    """

    def is_trainer(proc: psutil.Process) -> bool:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            cmd = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        return any(a == "--run-dir" and b == wanted for a, b in itertools.pairwise(cmd))

    wanted = str(run_dir)
    for pid in pids:
        if pid:
            try:
                if is_trainer(psutil.Process(pid)):
                    return pid
            except psutil.NoSuchProcess:
                continue
    if scan:
        for proc in psutil.process_iter():
            if proc.pid != os.getpid() and is_trainer(proc):
                return int(proc.pid)
    return None


def adopt_trainer(run_dir: Path, pids: Iterable[int | None]) -> TrainerProcess | None:
    """The live trainer of `run_dir` (see find_live_trainer) to watch; None when there is
    none, or when it exits before it is taken."""
    pid = find_live_trainer(run_dir, pids)
    if pid is None:
        return None
    try:
        return TrainerProcess(pid)
    except psutil.Error:
        return None
