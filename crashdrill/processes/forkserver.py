"""A fork server for trainers: one process imports torch and crashdrill once, then forks
every trainer start, so a start or a restart does not pay ~1.5 s of imports. The one
mechanism behind the drill's starts (drill/verify.py) and the lab's warm trainers on
every machine that runs them (workers/warm.py: the lab's own, and each Ray node's actor).

    server = ForkServer(preload=["crashdrill.cli", "crashdrill.trainer.loop"])
    child = server.spawn([sys.executable, "-m", "crashdrill", "run", …], env, cwd=None)
    child.pid, child.stdout, child.stderr   # its own pid and process group; pipes as with Popen
    child = server.spawn(argv, env, None, stdout=out, stderr=err)   # or files, as the lab's
    child.poll(), child.wait()              # the exit status its parent saw: -9 after SIGKILL
    server.close()                          # SIGKILLs what it still runs, then exits

Why the crash stays honest: each start is a new process, forked from a server that has
only imported code (it never opens a run dir, never builds a model, never touches a
tensor or CUDA). The child has its own pid, session and process group, gets the same
argv (its /proc cmdline is rewritten to it, so `ps`, a kill of the run's tree and a lab's
adoption after a restart find it as they find an exec'd one), environment, cwd and stdio
as an exec'd `python -m crashdrill run …`, and learns everything about its run from the
disk. It is SIGKILLed like any other process; the server is its parent, reaps it and
relays the exit status and CPU time over a socket that belongs to that child alone.
Nothing survives a kill but the files. A child that ends by itself exits with the status
the interpreter would give it, after joining its threads, running its atexit handlers and
flushing its output, but without freeing every object first (exit_without_teardown:
~0.2 s of CPU saved after a trainer's last step).

The server holds no CUDA context (forking one is unsafe: a CUDA preset's child initialises
CUDA itself, after the fork) and no thread pool: it only imports. Its own environment is
the one it was started with (the lab gives it a trainer's allowlisted one, never the
server's secrets); each child's is the request's. It exits when its owner closes the
control socket or dies. What happens to the children then is the owner's choice:
- the drill's (default): SIGKILLed first, so no trainer outlives the drill;
- `keep_children=True` (the lab's): they keep training, as exec'd trainers outlive a lab
  server that is killed, and the next server adopts them;
- `die_with_parent=True` (a Ray node's actor): the server and every child get SIGKILL
  when the one that started them dies (PR_SET_PDEATHSIG), so a removed node's trainer
  does not go on writing to the mirror while its run resumes elsewhere.
A server that dies or cannot start raises ForkServerError; the owner then starts its
processes with exec.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from crashdrill.processes.forkserver_protocol import (
    IMPORTED,
    RANKS_PRELOAD,
    START_TIMEOUT,
    TITLE_ARG,
    TITLE_ROOM,
    TRAINER_PRELOAD,
    CommandTooLong,
    ForkServerError,
    cmdline_bytes,
    die_with_parent_process,
    pair,
    readable,
    supported,
)

# The owner's side lives here; the protocol both sides share in forkserver_protocol.py, the
# server process's loop in forkserver_loop.py. Everyone imports from this module, which
# is also the one `-m` runs (its name is what `ps` shows as a trainer's parent).
__all__ = [
    "RANKS_PRELOAD",
    "START_TIMEOUT",
    "TRAINER_PRELOAD",
    "CommandTooLong",
    "ForkServer",
    "ForkServerError",
    "ForkedProcess",
    "PipedProcess",
    "die_with_parent_process",
    "readable",
    "supported",
]


class ForkedProcess:
    """A process the fork server started: what the engine needs of a Popen."""

    def __init__(
        self,
        pid: int,
        status: socket.socket,
        stdout: IO[bytes] | None,
        stderr: IO[bytes] | None,
        *,
        kill_when_lost: bool = True,
    ):
        self.pid = pid
        self.stdout = stdout  # None: its output went to the files given to spawn
        self.stderr = stderr
        self.returncode: int | None = None
        self.cpu_s: float | None = None  # user + system CPU seconds, from the server's wait4
        self._status = status
        self._lost: str | None = None  # why its exit status will never come
        self._kill_when_lost = kill_when_lost

    def fileno(self) -> int:
        """Readable once the process has ended (or the server died): for select."""
        return self._status.fileno()

    def poll(self) -> int | None:
        """The exit status once the process has ended (negative: the signal), else None."""
        if self.returncode is None:
            self._receive(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._receive(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        return self.returncode

    def _receive(self, timeout: float | None) -> None:
        if self._lost:
            raise ForkServerError(self._lost)
        if not readable(self._status, timeout):
            return
        try:
            msg = self._status.recv(4096)
        except OSError:
            msg = b""
        self._status.close()
        if not msg:  # the server died before it reaped this process
            if self._kill_when_lost:  # the drill's: nothing may run unwatched
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
            self._lost = f"the fork server exited before reporting how process {self.pid} ended"
            raise ForkServerError(self._lost)
        report = json.loads(msg)
        self.cpu_s = report["cpu"]
        self.returncode = int(report["exit"])


class PipedProcess(ForkedProcess):
    """A forked process whose stdout and stderr are pipes to read (spawn without files)."""

    stdout: IO[bytes]
    stderr: IO[bytes]


class ForkServer:
    """The server process and the control socket to it. Thread-safe: the reference and the
    crashed run start their processes from two threads."""

    def __init__(
        self,
        preload: list[str],
        *,
        env: dict[str, str] | None = None,
        keep_children: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        if not supported():
            raise ForkServerError("this platform has no fork server (fork, SOCK_SEQPACKET)")
        self.keep_children = keep_children
        # The server's stderr: why it died, if it does. Closed in close().
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        ours, theirs = pair()
        flags = ["--keep-children"] * keep_children + ["--die-with-parent"] * die_with_parent
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "crashdrill.processes.forkserver",
                    str(theirs.fileno()),
                    *flags,
                    *preload,
                    TITLE_ARG,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # a child's stdio is its own: dup2'ed at the fork
                stderr=self._log,
                env=env,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # a Ctrl-C meant for the drill does not reach it
                preexec_fn=die_with_parent_process if die_with_parent else None,
            )
        except OSError as e:
            ours.close()
            self._log.close()
            raise ForkServerError(f"cannot start the fork server: {e}") from None
        finally:
            theirs.close()
        self._control = ours
        self._lock = threading.Lock()
        self._spawned = 0
        self.pid = self._proc.pid
        self.started = time.monotonic()
        self.ready: float | None = None  # when the first start came back: imports done
        self.imported_at: float | None = None  # when the server said its imports were done
        self._said = threading.Lock()  # one reader of the control socket's one word

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        *,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        nice: int | None = None,
    ) -> ForkedProcess:
        """Start `python -m MODULE ARGS…` (argv as exec would get it) as a forked child.
        Its stdout and stderr: pipes to read (the child's `stdout`, `stderr`), or the open
        files given (appended to by the child alone, as an exec'd process would). `nice`:
        the child yields the CPU from its first instruction (cpu_priority.yield_cpu: nice
        and SCHED_BATCH, set right after the fork), not once it has started."""
        if argv[:2] != [sys.executable, "-m"] or len(argv) < 3:
            raise ValueError(f"the fork server runs `{sys.executable} -m MODULE …`, not {argv}")
        if (stdout is None) != (stderr is None):
            raise ValueError("give both stdout and stderr files, or neither (pipes)")
        if len(cmdline_bytes(argv)) > TITLE_ROOM:
            raise CommandTooLong(
                f"the command line of {argv[2]} is {len(cmdline_bytes(argv))} bytes, more than the"
                f" {TITLE_ROOM} a forked child can show"
            )
        request = {
            "module": argv[2],
            "args": argv[3:],
            "env": env,
            "cwd": cwd,
            "argv": argv,
            "nice": nice,
        }
        ours: list[int] = []  # the read ends of pipes made here
        theirs: list[int] = []  # what the child writes to (closed here once sent)
        for given in (stdout, stderr):
            if given is None:
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            else:
                theirs.append(os.dup(given.fileno()))
        status, status_theirs = pair()
        try:
            try:
                with self._lock:
                    self._spawned += 1
                    socket.send_fds(
                        self._control,
                        [json.dumps(request).encode()],
                        [*theirs, status_theirs.fileno()],
                    )
            finally:
                # Only the server (and, in flight, its queue) holds the child's ends now: a
                # server that dies before forking closes them, and the recv below sees EOF.
                for fd in theirs:
                    os.close(fd)
                status_theirs.close()
            status.settimeout(START_TIMEOUT)  # the first reply waits for the imports
            reply = status.recv(4096)
            status.settimeout(None)
            if not reply:
                raise OSError("it closed the child's status socket")
            answer = json.loads(reply)
        except OSError as e:  # includes a timeout and a dead server (EPIPE, ECONNRESET)
            answer = {"error": f"{e}{self.why()}"}
        if "error" in answer:  # the server's own answer (a failed fork), or its death
            status.close()
            for fd in ours:
                os.close(fd)
            raise ForkServerError(f"the fork server did not start {argv[2]}: {answer['error']}")
        self.ready = self.ready or time.monotonic()
        if ours:
            out, err = (os.fdopen(fd, "rb") for fd in ours)
            return PipedProcess(
                int(answer["pid"]), status, out, err, kill_when_lost=not self.keep_children
            )
        return ForkedProcess(
            int(answer["pid"]), status, None, None, kill_when_lost=not self.keep_children
        )

    def imported(self, timeout: float = 0.0) -> bool:
        """True once the server has imported its preload (torch): it says so on the
        control socket when done, before any start. Waits up to `timeout` for the word."""
        if self.imported_at is None and self.ready is None:
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile: not imported
                # The wait without the lock: a status asked meanwhile is not held up.
                if readable(self._control, timeout):
                    with self._said:
                        if (
                            self.imported_at is None
                            and readable(self._control, 0)
                            and self._control.recv(64, socket.MSG_DONTWAIT) == IMPORTED
                        ):
                            self.imported_at = time.monotonic()
        return self.imported_at is not None or self.ready is not None

    def spawn_piped(self, argv: list[str], env: dict[str, str], cwd: str | None) -> PipedProcess:
        """`spawn` with pipes for its stdout and stderr (what a reader of its output needs)."""
        child = self.spawn(argv, env, cwd)
        assert isinstance(child, PipedProcess)
        return child

    def alive(self) -> bool:
        return self._proc.poll() is None

    def why(self) -> str:
        """The server's exit status and last stderr line, when it has exited (it may take
        a moment after it closed its sockets)."""
        try:
            code = self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        self._log.seek(0)
        lines = self._log.read().decode("utf-8", "replace").strip().splitlines()
        return f" (fork server exit {code}{': ' + lines[-1] if lines else ''})"

    def close(self) -> None:
        """Close the control socket: the server SIGKILLs what it still runs (unless it
        keeps its children) and exits. One that never started anything is killed at once
        (it may still be importing)."""
        self.imported()  # its word read, so the close reaches it as EOF, not a reset
        self._control.close()
        try:
            self._proc.wait(timeout=10 if self._spawned else 0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._log.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    from crashdrill.processes.forkserver_loop import main

    main(sys.argv[1:])
