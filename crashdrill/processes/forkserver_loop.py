"""The fork server's own side: the process `python -m crashdrill.processes.forkserver`
starts (forkserver.py's ForkServer does), which imports the preload once, then forks a
child for every request on its control socket, reaps each and relays how it ended.

    main([control_fd, *flags, *preload])   # the server; returns only in a child, which
                                            # runs its module as `python -m` would

A child becomes what an exec'd `python -m MODULE` would have been (`_become`: its own
session, stdio, cwd, environment and command line) before its pid goes out.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, NoReturn

from crashdrill.processes.cpu_priority import yield_cpu
from crashdrill.processes.forkserver_protocol import (
    IMPORTED,
    MAX_REQUEST,
    POLL_SECONDS,
    READY_TIMEOUT,
    cmdline_bytes,
    die_with_parent_process,
    readable,
)


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
                msg, fds, _flags, _addr = socket.recv_fds(control, MAX_REQUEST, 3)
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
    title = cmdline_bytes(argv)
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


def _skip_op_deregistration() -> None:
    """torch.library deregisters each operator library it made (~170 once torch._dynamo is
    imported, as a trainer of several ranks has it) from a weakref finalizer run at exit:
    ~35 ms of CPU in a launcher whose lost rank ended its group, between the group's end
    and the supervisor's restart. The dispatcher they clean goes with the process a moment
    later (os._exit), so those finalizers are told not to run at exit; every other one
    (a temporary dir's removal…) still does. weakref.finalize's registry is private: where
    it is missing, nothing is skipped."""
    library = sys.modules.get("torch.library")
    deregister = getattr(library, "_del_library", None)
    registry = getattr(weakref.finalize, "_registry", None)
    if deregister is None or not isinstance(registry, dict):
        return
    for finalizer, info in list(registry.items()):
        if getattr(info, "func", None) is deregister:
            finalizer.atexit = False


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
    _skip_op_deregistration()
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
