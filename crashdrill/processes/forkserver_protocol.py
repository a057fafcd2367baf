"""What both sides of the fork server agree on (crashdrill/processes/forkserver.py, the
owner's side; forkserver_loop.py, the server's): the limits and the one word on the control
socket, the errors an owner sees, the socket pair they talk over, and how a command line
is laid out in the room a forked child has to show it.

A request is one SOCK_SEQPACKET message on the control socket: JSON {module, args, env,
cwd, argv, nice} with three descriptors (the child's stdout, stderr and its status
socket). The status socket carries {"pid"} (or {"error"}) once the child is itself, then
{"exit", "cpu"} when it has been reaped. EOF on it: the server died.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket

# What a warm process imports for trainers (the lab's, workers/warm.py, and the drill's,
# drill/builtin.py): code only (torch and everything `crashdrill run` imports), never a
# run's state, never CUDA. Names, not imports: this module stays below the trainer.
TRAINER_PRELOAD = [
    "crashdrill.cli",
    "crashdrill.trainer.presets",
    "crashdrill.trainer.loop",
    "crashdrill.trainer.warm_caches",
    "numpy.random",
]
# What a trainer of several ranks imports besides (torch.distributed, DCP, DDP, and the
# torch._dynamo that DDP's constructor imports): about 1.8 s and 900 modules on the 2-core
# machine, paid by every restarted group that was forked without them (benchmarks/ranks.py).
RANKS_PRELOAD = ["crashdrill.trainer.rank_loop"]
START_TIMEOUT = 120.0  # seconds the first start may wait for the server's imports
POLL_SECONDS = 0.005  # reaping interval where pidfd_open is missing
READY_TIMEOUT = 10.0  # seconds a new child may take to become itself before its pid goes out
MAX_REQUEST = 1 << 20  # the largest request (argv + environment) the server reads
IMPORTED = b"imported"  # the server's one word on the control socket: its preload is in
# Bytes of command line a child can show: the server is started with a blank argument this
# long, and a child writes its own argv over the server's (the kernel's arg area is fixed).
TITLE_ROOM = 1024
TITLE_ARG = "--title-room=" + " " * TITLE_ROOM
PR_SET_PDEATHSIG = 1


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


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of message sockets: the control socket, and each child's status."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def die_with_parent_process() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG; Linux). Safe between
    fork and exec: no allocation but ctypes' own."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def cmdline_bytes(argv: list[str]) -> bytes:
    """The command line as /proc/PID/cmdline holds it: NUL-terminated arguments."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)
