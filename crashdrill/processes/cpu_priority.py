"""Make a process yield the CPU to everything else on its machine: nice N and SCHED_BATCH,
applied by whoever starts it, in the child before it runs a line of its own.

    yield_cpu(10)           # this process, every thread: nice ≥ 10, policy SCHED_BATCH
    priority_of(pid)        # (10, "batch"): what /proc says of a process's main thread

Why these two and not cgroup v2 `cpu.weight`: a weight needs a cgroup v2 hierarchy with
the cpu controller delegated to the lab (a writable cgroup of its own); most machines a
lab runs on (a container, a VM with cgroup v1, a user session without delegation) have
none, and nice plus a scheduling policy work everywhere on Linux, unprivileged. Nice 10
gives a trainer a tenth of the server's CFS weight (110 against 1024); SCHED_BATCH also
tells the scheduler the process is CPU-bound, so its wake-ups never preempt the server's.
SCHED_IDLE is not used: a trainer would then get only what every other process on the
machine leaves over, and a lab on a shared machine would stop training altogether.

Raising one's own nice value and moving to SCHED_BATCH need no privilege; nothing here
ever lowers a nice value. Threads started later inherit both from the thread that starts
them. Priority changes no result: training is deterministic at any speed.
"""

from __future__ import annotations

import os

POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle"}  # sched.h numbers


def yield_cpu(nice: int) -> bool:
    """Lower every thread of this process to nice `nice` (never raise a priority) and move
    it to SCHED_BATCH (a real-time or idle one is left alone); False where the platform
    cannot. Safe between fork and exec (no lock, no allocation beyond a few objects)."""
    if not hasattr(os, "setpriority"):
        return False
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # 0: the calling thread (no /proc: not Linux)
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            batch = getattr(os, "SCHED_BATCH", None)
            if batch is not None and os.sched_getscheduler(tid) == os.SCHED_OTHER:
                os.sched_setscheduler(tid, batch, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile
            continue
    return True


def priority_of(pid: int) -> tuple[int, str]:
    """(nice, policy name) of `pid`'s main thread, from /proc/PID/stat (fields 19 and 41)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[16]), POLICIES.get(int(fields[38]), fields[38].decode())
