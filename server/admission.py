"""How many runs the lab lets train at once: what the machine carries, measured from the
lab's own step rates and start times, never more than `max_concurrent`.

    admission = Admission.from_settings(settings)    # the lab's, one per server
    admission.limit(active, start_times)              # a scheduling pass: runs at once now
    admission.status()                                # GET /api/health's `admission`
    admission.warning                                 # the start line's; None when not clamped

A CPU preset trains with one thread, so a machine carries one run per core at full pace
(a pair per GPU: `machine_runs`). It often carries a little more: a trainer waits on its
checkpoint writes and evaluations, and a pair's partner that ended early leaves its core
idle while the other run recomputes after a crash test. So on the local executor the lab
always admits `machine_runs`, and up to twice that (`ceiling`: the default
`max_concurrent`) while the runs that train now keep their pace: the median seconds per
step of the active runs of each preset within KEEPS_PACE of the fastest this lab has
measured for that preset, and the newest starts' median within KEEPS_PACE of the fastest
start (server/start_times.py). A machine that slows down (more runs than cores, or other
work on it) starts no run beyond `machine_runs` until runs end; nothing already training
is stopped. Before any run has trained here nothing is measured: `machine_runs`.

A `max_concurrent` above the ceiling is a lab sized for its class, not for its machine:
sixty runs on two cores starved the server, its streams and every crash test's restart
(issue 38). It is clamped to the ceiling, with a warning in the start line and in
`/api/health`, unless `allow_overcommit` keeps it: then `max_concurrent` runs at once,
measured or not (the operator's choice). On a cluster the nodes train, not this machine:
no `max_concurrent`, no limit (the nodes are the queue); one given is the limit, as given.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crashdrill.server.queue_wait import RunWork
from crashdrill.server.start_times import StartTimes

if TYPE_CHECKING:
    from crashdrill.server.settings import Settings

OVERCOMMIT = 2  # runs per core a CPU machine may be given while its runs keep their pace
KEEPS_PACE = 1.5  # a median step (or start) this much slower than the fastest: full


def count_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine_runs(gpus: int, cores: int | None = None) -> int:
    """Runs this machine carries at full pace: a pair per GPU; on CPU one run per core
    (presets train with threads = 1), at least 2 (a pair)."""
    if gpus:
        return 2 * gpus
    return max(2, count_cores() if cores is None else cores)


def machine_ceiling(gpus: int, cores: int | None = None) -> int:
    """The most runs the lab admits on this machine without `allow_overcommit`: on CPU
    OVERCOMMIT × machine_runs, measured in between; on GPUs machine_runs (their memory)."""
    runs = machine_runs(gpus, cores)
    return runs if gpus else OVERCOMMIT * runs


class Admission:
    """The run limit: `floor` always, up to `ceiling` while the machine keeps pace."""

    def __init__(
        self,
        asked: int | None,
        floor: int,
        ceiling: int,
        allow_overcommit: bool = False,
        *,
        fixed: bool = False,
    ) -> None:
        """`asked`: max_concurrent; `floor`: the machine's runs; `ceiling`: the most
        without `allow_overcommit`; `fixed`: `asked` is the limit, nothing measured."""
        self.asked = asked  # max_concurrent as configured (None: a cluster's queue)
        self.machine = floor
        self.allow_overcommit = allow_overcommit
        self.clamped = asked is not None and asked > ceiling and not (allow_overcommit or fixed)
        self.ceiling = None if asked is None else min(asked, ceiling) if self.clamped else asked
        self.floor = None if self.ceiling is None else min(floor, self.ceiling)
        if allow_overcommit or fixed:  # as many as asked, measured or not: the operator's choice
            self.floor = self.ceiling
        self.warning: str | None = None
        if self.clamped:
            self.warning = (
                f"max_concurrent {asked} is more than this machine carries, clamped to"
                f" {self.ceiling} runs at once ({floor} always, more while the runs keep"
                " their pace): allow_overcommit (--allow-overcommit) keeps it"
            )
        self._fastest_step: dict[str, float] = {}  # preset: the fastest s/step measured
        self._fastest_start: float | None = None
        self._lock = threading.Lock()
        self._last: dict[str, Any] = {"limit": self.floor, "keeps_pace": None}

    @classmethod
    def from_settings(cls, settings: Settings, gpus: int | None = None) -> Admission:
        from crashdrill.server.settings import count_gpus

        if settings.on_cluster:  # the nodes train, not this machine: the limit as given
            n = settings.max_concurrent
            return cls(n, n or 0, n or 0, settings.allow_overcommit, fixed=True)
        gpus = count_gpus() if gpus is None else gpus
        return cls(
            settings.max_concurrent,
            machine_runs(gpus),
            machine_ceiling(gpus),
            settings.allow_overcommit,
        )

    def limit(self, active: Sequence[RunWork], start_times: StartTimes | None = None) -> int | None:
        """Runs at once for this pass (None: no limit, a cluster's queue)."""
        if self.ceiling is None or self.floor is None:
            return None
        keeps = self._keeps_pace(active, start_times)
        limit = self.ceiling if keeps else self.floor
        with self._lock:
            self._last = {"limit": limit, "keeps_pace": keeps}
        return limit

    def _keeps_pace(self, active: Sequence[RunWork], start_times: StartTimes | None) -> bool:
        """Do the runs training now keep the pace this lab measured when it had room?
        False while nothing is measured."""
        by_preset: dict[str, list[float]] = {}
        for w in active:
            if w.s_per_step is not None and w.s_per_step > 0:
                by_preset.setdefault(w.preset, []).append(w.s_per_step)
        start = start_times.fastest() if start_times is not None else None
        median_start = start_times.summary()["median_s"] if start_times is not None else None
        with self._lock:
            for preset, paces in by_preset.items():
                best = self._fastest_step.get(preset)
                self._fastest_step[preset] = min(paces) if best is None else min(best, *paces)
            if start is not None:
                best = self._fastest_start
                self._fastest_start = start if best is None else min(best, start)
            if not by_preset:
                return False
            for preset, paces in by_preset.items():
                if statistics.median(paces) > KEEPS_PACE * self._fastest_step[preset]:
                    return False
            fastest = self._fastest_start
            return not (median_start and fastest and median_start > KEEPS_PACE * fastest)

    def status(self) -> dict[str, Any]:
        """GET /api/health's `admission`."""
        with self._lock:
            last = dict(self._last)
        return {
            "max_concurrent": self.asked,
            "machine_runs": self.machine,
            "ceiling": self.ceiling,
            "limit": last["limit"],
            "keeps_pace": last["keeps_pace"],
            "clamped": self.clamped,
            "allow_overcommit": self.allow_overcommit,
            "warning": self.warning,
        }

    def describe(self) -> str:
        """The start line's words."""
        if self.ceiling is None:
            return "as many runs at once as the cluster's nodes take"
        if self.floor == self.ceiling:
            text = f"up to {self.ceiling} runs at once"
        else:
            text = f"{self.floor} runs at once, up to {self.ceiling} while they keep their pace"
        return f"{text} (WARNING: {self.warning})" if self.warning else text
