"""A trainer's CPU priority in a shared lab: full priority while it starts (or restarts
after a crash test), a lower one once it trains.

    NICE_VARIABLE = "CRASHDRILL_TRAINER_NICE"   # set by the lab (server setting trainer_nice)
    settle_after_first_step()                   # the loop calls it after its first step record

Thirty students' sixty runs on two cores: at equal priority a restarted trainer gets a
sixtieth of the machine for its checkpoint load and first step, and the lab server (its
records, streams and pages) as little. So the lab starts every trainer at the server's
priority and, once the trainer has written its first step record, the trainer lowers
every thread of its own to nice N (Linux nice is per thread; threads started later inherit
from the main thread). Raising one's own nice value needs no privilege, and nothing ever
lowers it. Priority changes no result: training is deterministic at any speed.
Without the variable (a run by hand, the drill) nothing changes.
"""

from __future__ import annotations

import os

NICE_VARIABLE = "CRASHDRILL_TRAINER_NICE"


def wanted_nice(environ: dict[str, str] | None = None) -> int | None:
    """The nice value the lab asked for (0–19), None when unset or not a number in range."""
    raw = (environ if environ is not None else os.environ).get(NICE_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 0 <= value <= 19 else None


def settle_after_first_step(environ: dict[str, str] | None = None) -> int | None:
    """Lower this process's threads to the lab's nice value (never raise a priority);
    the value set, or None when nothing was asked or the platform cannot."""
    nice = wanted_nice(environ)
    if nice is None or not hasattr(os, "setpriority"):
        return None
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # 0: the calling thread (no /proc: not Linux)
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # a thread that ended meanwhile
            continue
    return nice
