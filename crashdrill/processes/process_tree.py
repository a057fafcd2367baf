"""Kill a process and everything it started, whatever session or process group each one
made for itself (torchrun starts its ranks with `start_new_session=True`, so killing the
launcher's group leaves them training as orphans).

    become_subreaper()                         # once, in the process that starts runs
    env = {**os.environ, **tree_marker(token)} # give every process of one run a marker
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    killed = kill_tree(proc.pid, marker=token) # SIGKILL all of it; how many processes died
    proc.wait()                                # the root stays the caller's to reap

How a kill finds every process:

- the tree under the root pid, read from /proc (each process's parent), walked again and
  again while everything found is first stopped with SIGSTOP: a stopped process cannot
  fork, so when a walk finds nothing new the tree is complete; then SIGKILL to all of it
  at once, and walks until none is left;
- a process whose parent exited earlier has left the tree: as a child subreaper
  (prctl(PR_SET_CHILD_SUBREAPER), Linux) the caller adopts it instead of init, and with a
  `marker` every process of ours whose environment carries it is part of the run too,
  wherever it was re-parented (unless it cleared its environment);
- killed processes that this process adopted are reaped here; the root is not.

Where /proc is missing (not Linux) the kill falls back to the root's process group.
The drill (drill/engine.py) uses it for every kill, and so does the lab's supervisor
(workers/trainer_process.py: the run dir is the marker).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable

import psutil

MARKER_VAR = "CRASHDRILL_PROCESS_TREE"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_PROC = "/proc"


class ProcessTreeError(RuntimeError):
    """Processes of the tree were still alive after the kill's time was up."""


def supported() -> bool:
    """True where the tree can be read (/proc, Linux)."""
    return sys.platform.startswith("linux") and os.path.isdir(_PROC)


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts: a descendant whose
    parent dies is re-parented here, not to init, so it stays findable (and this process
    reaps it). True when set; False where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def tree_marker(token: str) -> dict[str, str]:
    """The environment entry that marks every process of one run (inherited by default)."""
    return {MARKER_VAR: token}


_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _status(pid: int) -> tuple[str, int] | None:
    """(psutil status, parent pid) of one process, None when it is gone."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return proc.status(), proc.ppid()
    except psutil.NoSuchProcess:  # a zombie is still there: ZombieProcess is not raised here
        return None


# The walk (members) reads /proc itself. psutil does the same job (process_iter with ppid,
# status and environ) 3-5 times slower: measured ~30 ms against ~6 ms a walk over 100
# processes, and kill_tree of a 4-process tree took ~150 ms against ~50 ms, a cost every
# crash test and drill kill would pay before its SIGKILL lands. psutil also gives no start
# time in clock ticks since boot, which the "born before the kill" rule compares.


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name: state, ppid, …, starttime (index 19)."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # pid (comm) state ppid …: comm may hold spaces and parentheses, so split at the last ')'
    return data[data.rfind(b")") + 2 :].split()


def _ticks_before_now() -> int:
    """The last clock tick (since boot, as /proc/PID/stat's starttime counts them) that
    ended before now: a process whose starttime is at most this was born before this
    call. /proc/uptime is now rounded down to the tick, so its own tick is ambiguous."""
    with open(f"{_PROC}/uptime", "rb") as f:
        uptime = float(f.read().split()[0])
    return round(uptime * os.sysconf("SC_CLK_TCK")) - 1


def _has_marker(pid: int, entry: bytes) -> bool:
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def members(
    pid: int,
    marker: str | None = None,
    born_by: int | None = None,
    roots: Iterable[int] = (),
) -> set[int]:
    """The live (not zombie) processes of the tree now: `pid`, its descendants, and with
    `marker` every process carrying it (with `born_by`, only those started by then, in
    clock ticks since boot: a new process of the run, started after a kill began, is not
    part of the tree that kill takes down), and the descendants of `roots` (what a kill
    already found)."""
    parents: dict[int, list[int]] = {}
    live: set[int] = set()
    entry = f"{MARKER_VAR}={marker}".encode() if marker is not None else None
    marked: set[int] = set()
    me = os.getpid()
    for p in psutil.pids():
        fields = _stat_fields(p)
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        live.add(p)
        parents.setdefault(int(fields[1]), []).append(p)
        if entry is not None and p != me and _has_marker(p, entry):
            born = int(fields[19]) if born_by is not None and len(fields) > 19 else None
            if born is None or born_by is None or born <= born_by:
                marked.add(p)
    found: set[int] = set()
    stack = [pid, *marked, *roots]
    while stack:
        p = stack.pop()
        if p in found:
            continue
        found.add(p)
        stack.extend(parents.get(p, ()))
    return found & live


def _signal(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def kill_tree(pid: int, *, marker: str | None = None, timeout: float = 5.0) -> int:
    """SIGKILL `pid` and every process of its tree (see the module docstring) until none is
    left; returns how many processes were killed (0: it had ended already). The root is
    left for the caller to reap; adopted ones are reaped here. ProcessTreeError when some
    are still alive after `timeout` seconds (stuck in the kernel, or not ours to kill)."""
    if not supported():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return 1
    me = os.getpid()
    # The first walk runs while the root still lives, so before any supervisor can start
    # the run's next trainer: every marked process it finds is this tree's. Later walks
    # take a marked process only if it was born before the kill began (the next trainer,
    # same marker, may start the moment the root dies, within the same clock tick), and
    # forks of what was found by parentage.
    born_by = _ticks_before_now() if marker is not None else None
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    first = True
    while True:
        stopped: set[int] = set()
        while True:  # freeze: a stopped process cannot fork, so the walk converges
            since = None if first else born_by
            found = members(pid, marker, since, roots=stopped | killed) - {me} - stopped
            first = False
            if not found:
                break
            _signal(found, signal.SIGSTOP)
            stopped |= found
        if not stopped:
            break
        _signal(stopped, signal.SIGKILL)
        killed |= stopped
        _wait_gone(stopped, deadline)
        if time.monotonic() > deadline:
            left = members(pid, marker, born_by) - {me}
            if left:
                raise ProcessTreeError(f"still alive after SIGKILL: {sorted(left)}")
            break
    _reap_adopted(killed - {pid})
    return len(killed)


def _wait_gone(pids: set[int], deadline: float) -> None:
    """Until every pid is a zombie or gone (SIGKILL is asynchronous)."""
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if (st := _status(p)) is not None and st[0] not in _GONE}
        if pending:
            time.sleep(0.001)


def _reap_adopted(pids: Iterable[int]) -> None:
    """Reap the killed processes that are this process's children by adoption (a
    subreaper's): nobody else will. Started ones (Popen's) are the caller's; their pids are
    not passed here."""
    me = os.getpid()
    for p in pids:
        st = _status(p)
        if st is not None and st[1] == me:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p, os.WNOHANG if st[0] not in _GONE else 0)


def adopted(started: Iterable[int]) -> set[int]:
    """This process's live children that it did not start: orphans adopted as subreaper."""
    known = set(started)
    out = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.pid not in known and child.status() not in _GONE:
                out.add(child.pid)
    return out
