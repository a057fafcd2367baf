"""A kill the lab has signalled whose restart has written no step yet: a crash test (armed
until it lands, for a crash mode that waits for a save) or a preemption. The one rule for
"is one pending", read by the run view (server/views.py: `pending_kill`, `can_crash`,
`can_preempt`), by the crash and preempt routes (server/run_control.py: no second one) and
by a server that adopts a trainer after a restart (server/lab.py: an armed kill is armed
again).

    stored = signalled("crash", "during_save", row)   # into runs.pending_kill_json
    stored = armed_for_first_step("kill", row, latest)   # pressed before the first step
    pending_kill(row, latest)   # {"kind", "mode", "armed", "first_step", "at_step", "segment"}
    fires(pending, latest)       # an armed-for-first-step kill: its step is stored now

A crash test pressed while the run is starting or restarting is armed for the trainer's
first step (`first_step`: its `segment` is the one whose first step record fires it: the
run's own while it starts, the next one while a kill's restart is on its way). It stays
armed until the lab signals it (server/run_control.py replaces it with `signalled`'s) or
the run ends; it never expires by a newer segment, which is what it waits for.

Why a column and not the records: the signal is the lab's, not the trainer's, and the
supervisor writes into the records file only while no trainer is alive (workers/
supervisor.py); between the press and the restart's first step record the records say
nothing of it. So the lab keeps it in the run's row (migration 0006), where a server
restart finds it. It is never cleared by a write: it stops counting once a step record of
a newer segment is stored (what the page waits for too), whatever a late record of the
killed trainer says, or once the run has ended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import ACTIVE_STATES, RunState
from crashdrill.trainer.crash_modes import mode_named
from crashdrill.trainer.stages import Stage

KINDS = ("crash", "preempt")
PREEMPT_MODE = "preempt"  # a preemption's `mode`, as the restart event's crash_mode says


def signalled(kind: str, mode: str, row: Row) -> str:
    """The runs.pending_kill_json of a kill of `kind` just signalled to the run `row`
    (a crash test in crash mode `mode`, or a preemption: PREEMPT_MODE)."""
    if kind not in KINDS:
        raise ValueError(f"pending kill kind {kind!r}: one of {', '.join(KINDS)}")
    armed = kind == "crash" and mode_named(mode).waits_for_save
    return json.dumps(
        {
            "kind": kind,
            "mode": mode,
            "armed": armed,
            "at_step": row["step"],
            "segment": row["segment"] or 0,
        }
    )


def armed_for_first_step(mode: str, row: Row, latest: Mapping[str, Any]) -> str:
    """The runs.pending_kill_json of a crash test in `mode` pressed before the run's
    trainer wrote its first step record (starting, or restarting after a kill whose
    restart has written no step yet)."""
    segment = row["segment"] or 0
    before = pending_kill(row, latest)
    if before is not None:  # a kill's restart: its trainer writes the next segment
        segment = max(segment, before["segment"] + 1)
    return json.dumps(
        {
            "kind": "crash",
            "mode": mode,
            "armed": True,
            "first_step": True,
            "at_step": row["step"],
            "segment": segment,
        }
    )


def fires(pending: Mapping[str, Any], latest: Mapping[str, Any]) -> bool:
    """Whether an armed-for-first-step kill's step record is stored: a step of its segment
    or a later one."""
    newest = _newest_step_segment(latest)
    return bool(pending.get("first_step")) and newest is not None and newest >= pending["segment"]


def _newest_step_segment(latest: Mapping[str, Any]) -> int | None:
    step = latest.get("step")
    if not isinstance(step, dict):
        return None
    segment = step.get("segment", 0)
    return segment if isinstance(segment, int) else 0


def pending_kill(row: Row, latest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's pending kill, or None: none was signalled, the run has ended, or a step
    record of a newer segment than the one it hit is stored. `armed` stays true only
    while a kill that waits for a save has not landed: the run is neither restarting nor
    in a newer segment."""
    try:
        stored = row["pending_kill_json"]
    except (KeyError, IndexError):  # a row made without the column (sqlite3.Row: IndexError)
        stored = None
    if not stored or row["state"] not in ACTIVE_STATES:
        return None
    try:
        kill = json.loads(stored)
        segment = int(kill["segment"])
    except (TypeError, ValueError, KeyError):
        return None
    if kill.get("first_step"):  # armed until it is signalled (replaced) or the run ends
        return {
            "kind": "crash",
            "mode": kill.get("mode"),
            "armed": True,
            "first_step": True,
            "at_step": kill.get("at_step"),
            "segment": segment,
        }
    newest = _newest_step_segment(latest)
    if newest is not None and newest > segment:
        return None
    landed = (
        row["state"] == RunState.RESTARTING
        or row["stage"] == Stage.RESTARTING
        or (row["segment"] or 0) > segment
    )
    return {
        "kind": kill.get("kind"),
        "mode": kill.get("mode"),
        "armed": bool(kill.get("armed")) and not landed,
        "first_step": False,
        "at_step": kill.get("at_step"),
        "segment": segment,
    }
