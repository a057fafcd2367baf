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

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from crashdrill.processes.cpu_priority import yield_cpu

# What a warm process imports for trainers (the lab's, workers/warm.py, and the drill's,
# drill/builtin.py): code only (torch and everything `crashdrill run` imports), never a
# run's state, never CUDA. Names, not imports: this module stays below the trainer.
TRAINER_PRELOAD = [
    "crashdrill.cli",
    "crashdrill.trainer.presets",
    "crashdrill.trainer.loop",
    "numpy.random",
]
START_TIMEOUT = 120.0  # seconds the first start may wait for the server's imports
POLL_SECONDS = 0.005  # reaping interval where pidfd_open is missing
READY_TIMEOUT = 10.0  # seconds a new child may take to become itself before its pid goes out
_MSG = 1 << 20  # the largest request (argv + environment) the server reads
IMPORTED = b"imported"  # the server's one word on the control socket: its preload is in
# Bytes of command line a child can show: the server is started with a blank argument this
# long, and a child writes its own argv over the server's (the kernel's arg area is fixed).
TITLE_ROOM = 1024
_TITLE_ARG = "--title-room=" + " " * TITLE_ROOM
_PR_SET_PDEATHSIG = 1


class ForkServerError(RuntimeError):
    """The fork server could not start a process or report how one ended."""


class CommandTooLong(ForkServerError):
    """This command line does not fit the room a forked child has to show it (the server
    is fine: start this one with exec)."""


def supported() -> bool:
    """fork, fd passing and SOCK_SEQPACKET Unix sockets (Linux): else the drill uses exec."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and hasattr(socket, "SOCK_SEQPACKET")


def readable(fd: int | socket.socket, timeout: float | None) -> bool:
    """Block until `fd` is readable (or at EOF) or `timeout` passed. poll(2), not
    select(2): the lab server holds connections by the thousand, so the descriptors its
    threads wait on are often numbered past select's FD_SETSIZE (1024), where select()
    raises ValueError (issue #24: a crash test's restart never happened)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


# ------------------------------------------------------------------ the drill's side


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
        ours, theirs = _pair()
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
                    _TITLE_ARG,
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
        if len(_title(argv)) > TITLE_ROOM:
            raise CommandTooLong(
                f"the command line of {argv[2]} is {len(_title(argv))} bytes, more than the"
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
        status, status_theirs = _pair()
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


# ------------------------------------------------------------------ the server's side


@dataclass
class _Request:
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    argv: list[str]  # the command line it shows, as an exec'd one would
    nice: int | None = None  # yield the CPU from the fork on (cpu_priority.yield_cpu)


@dataclass
class _Child:
    status: socket.socket
    pidfd: int | None


def serve(
    control: socket.socket, *, keep_children: bool = False, die_with_parent: bool = False
) -> _Request:
    """Fork a child for every request. Returns only in a child, with its request; the
    server itself exits when the control socket closes (its children SIGKILLed first,
    unless `keep_children`)."""
    server_pid = os.getpid()
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, None)
    children: dict[int, _Child] = {}
    while True:
        polling = any(c.pidfd is None for c in children.values())
        for key, _ in sel.select(POLL_SECONDS if polling else None):
            if key.data is not None:
                continue  # a pidfd: the child exited, reaped below
            try:
                msg, fds, _flags, _addr = socket.recv_fds(control, _MSG, 3)
            except ConnectionResetError:  # closed with our IMPORTED word unread: an EOF
                msg, fds = b"", []
            if not msg:
                if not keep_children:
                    _shutdown(children)
                sys.stderr.flush()
                os._exit(0)  # no interpreter teardown: with torch loaded it takes ~0.5 s
            request = _Request(**json.loads(msg))
            status = socket.socket(fileno=fds[2])
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            ready_r, ready_w = os.pipe()  # closed by the child once it is itself
            try:
                with warnings.catch_warnings():
                    # Python ≥ 3.12 warns about forking with native threads; numpy's BLAS
                    # pool is one, and it re-creates itself after a fork (pthread_atfork).
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError as e:
                _send(status, {"error": f"fork failed: {e}"})
                status.close()
                for fd in (*fds[:2], ready_r, ready_w):
                    os.close(fd)
                continue
            if pid == 0:
                # The child: none of the server's fds, stdio from the request.
                os.close(ready_r)
                sel.close()
                control.close()
                for c in children.values():
                    c.status.close()
                    if c.pidfd is not None:
                        os.close(c.pidfd)
                status.close()
                if die_with_parent:
                    die_with_parent_process()
                    if os.getppid() != server_pid:  # the server died before the prctl
                        os._exit(1)
                _become(request, fds[0], fds[1])
                os.close(ready_w)
                return request
            for fd in (*fds[:2], ready_w):
                os.close(fd)  # only the child writes to its pipes: EOF when it (and its own) end
            # The pid goes out once the child leads its own session and shows its command
            # line (or has died trying): a kill, a group signal or an adoption that follows
            # at once finds what an exec'd process would be.
            readable(ready_r, READY_TIMEOUT)
            os.close(ready_r)
            pidfd = _pidfd(pid)
            children[pid] = _Child(status, pidfd)
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ, pid)
            _send(status, {"pid": pid})
        for pid in list(children):
            if _reap(pid, children[pid], block=False):
                child = children.pop(pid)
                if child.pidfd is not None:
                    sel.unregister(child.pidfd)
                    os.close(child.pidfd)


def die_with_parent_process() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG; Linux). Safe between
    fork and exec: no allocation but ctypes' own."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _title(argv: list[str]) -> bytes:
    """The command line as /proc/PID/cmdline holds it: NUL-terminated arguments."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


def _set_cmdline(argv: list[str]) -> bool:
    """Show `argv` as this process's command line (ps, psutil, /proc/PID/cmdline), as
    setproctitle does: the arguments are written over the kernel's arg area, which the
    server made TITLE_ROOM bytes long, the rest zeroed. False where it cannot."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat 48, 49)
    except (OSError, IndexError, ValueError):
        return False
    title = _title(argv)
    if not start or len(title) > end - start:
        return False
    ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)
    return True


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux ≥ 5.3: poll instead
        return None


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the drill gave up on this child: nobody to tell
        sock.send(json.dumps(msg).encode())


def _reap(pid: int, child: _Child, *, block: bool) -> bool:
    """wait4 the child; when it has ended, relay its exit status and CPU seconds."""
    got, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
    if not got:
        return False
    code = os.waitstatus_to_exitcode(status)
    _send(child.status, {"exit": code, "cpu": usage.ru_utime + usage.ru_stime})
    child.status.close()
    return True


def _shutdown(children: dict[int, _Child]) -> None:
    """The drill is gone or done: nothing it started may keep running."""
    for pid in children:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    for pid, child in children.items():
        _reap(pid, child, block=True)


def _become(request: _Request, stdout_fd: int, stderr_fd: int) -> None:
    """Turn the forked server into the process `python -m MODULE` would have been."""
    if request.nice is not None:
        yield_cpu(request.nice)  # before anything of its own: the server keeps the CPU
    os.setsid()  # its own session and process group, as with start_new_session=True
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (devnull, stdout_fd, stderr_fd):
        os.close(fd)
    if request.cwd is not None:
        os.chdir(request.cwd)
    _set_cmdline(request.argv)
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    os.environ.clear()
    os.environ.update(request.env)
    # A new interpreter seeds numpy's global RNG from the OS (Python's `random` reseeds
    # itself after a fork): a child that forgot to restore it must not get a stream that
    # every sibling shares. torch's default generator starts at a fixed seed either way.
    np_random = sys.modules.get("numpy.random")  # when not imported yet, the child seeds it
    if np_random is not None:
        np_random.seed()


def run_as_main(module: str) -> int:
    """Run `module` as `python -m` would; the exit status the interpreter would give it
    (SystemExit's code, 1 with the traceback printed for an uncaught exception)."""
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # sys.exit("message"), as the interpreter does
        return 1
    except KeyboardInterrupt:
        raise  # the interpreter's own way: it ends by SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def exit_without_teardown(code: int) -> NoReturn:
    """End the process as the interpreter would at its end, minus freeing every object:
    non-daemon threads joined, atexit handlers run, stdout and stderr flushed (a failed
    flush of a successful run exits 120, as the interpreter does). With torch loaded the
    teardown costs a forked trainer ~0.2 s of CPU after its last step, on the drill's
    critical path; it frees memory and changes no file the run wrote (records are single
    os.writes, checkpoints are fsync'ed before their manifest)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    os._exit(code)


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    flags = {a for a in argv[1:] if a.startswith("--")}
    for module in argv[1:]:
        if not module.startswith("--"):
            importlib.import_module(module)
    gc.freeze()  # the imported modules stay shared with the children, not copied on write
    with contextlib.suppress(OSError):
        control.send(IMPORTED)  # the owner's health says "ready" from here on
    request = serve(
        control,
        keep_children="--keep-children" in flags,
        die_with_parent="--die-with-parent" in flags,
    )
    # Only a forked child gets here: run the module as `python -m` would, exit the same way.
    sys.argv = [request.module, *request.args]
    exit_without_teardown(run_as_main(request.module))


if __name__ == "__main__":
    main(sys.argv[1:])
