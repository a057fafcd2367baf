"""A trainer's CPU priority in a shared lab: it yields to the lab server from the moment it
starts, not only once it trains.

    NICE_VARIABLE = "CRASHDRILL_TRAINER_NICE"   # set by the lab (server setting trainer_nice)
    wanted_nice(env)                            # 10, or None: not asked

Thirty students' sixty runs on two cores: at the server's priority the trainers take the
CPU the server needs for its records, streams and pages, and a start (its imports, its
model build, its first step) takes as much as any step. So the lab puts this variable in
every trainer's environment, and whoever starts the trainer applies it in the child before
the trainer runs a line of its own (workers/trainer_process.py: right after the fork from
the warm process, or before the exec; crashdrill/processes/cpu_priority.py: nice N and
SCHED_BATCH, and why not a cgroup weight). Raising one's own nice value needs no
privilege, and nothing ever lowers it. Priority changes no result: training is
deterministic at any speed. Without the variable (a run by hand, the drill) nothing
changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

NICE_VARIABLE = "CRASHDRILL_TRAINER_NICE"


def wanted_nice(environ: Mapping[str, str] | None = None) -> int | None:
    """The nice value the lab asked for (1–19), None when unset, 0 (the server's own
    priority: nothing to do) or not a number in range."""
    raw = (environ if environ is not None else os.environ).get(NICE_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 1 <= value <= 19 else None
