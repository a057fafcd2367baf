"""What the API shows of pairs, runs and records (dicts ready for JSON)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from crashdrill.server.lessons.pending_kill import pending_kill
from crashdrill.server.rank_view import ranks_view
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import ACTIVE_STATES, RunState
from crashdrill.trainer.record_contract import STATE_KINDS, finite_or_null, to_json
from crashdrill.trainer.stages import Stage
from crashdrill.workers.restart_events import RESTART_KINDS, restart_kind

# A run's `latest` shows the newest record of each state kind of the run-record contract,
# but the `run` record (its whole config) only through `steps`.
SHOWN_LATEST = tuple(k for k in STATE_KINDS if k != "run")


def record_json(record_id: int, run_id: str, data: str) -> str:
    """A stored record (JSON object text, never empty: it has a kind) with its id and
    run spliced in, without parsing it again (unless a number in it is not finite: stored
    before ingest made those null, issue #24)."""
    if "NaN" in data or "Infinity" in data:
        data = to_json(json.loads(data))
    return f'{{"id":{record_id},"run":{json.dumps(run_id)},{data[1:]}'


def queue_positions(queued: Sequence[Row]) -> dict[str, int]:
    """1-based position of every queued run (rows in queue order)."""
    return {row["id"]: i + 1 for i, row in enumerate(queued)}


def total_steps(pair: Mapping[str, Any], latest: Mapping[str, Any]) -> int | None:
    """Steps the run will train: from its `run` record's config, else from the preset."""
    config = (latest.get("run") or {}).get("config")
    if isinstance(config, dict) and isinstance(config.get("steps"), int):
        return int(config["steps"])
    steps = json.loads(pair["preset_json"]).get("run", {}).get("steps")
    return steps if isinstance(steps, int) else None


def training(row: Row, latest: Mapping[str, Any]) -> bool:
    """Whether a crash test or a preemption may hit the run now: it is active, in stage
    train, and its trainer of the newest segment has written a step record. The state
    may still say starting or restarting: a forked trainer's first records can be stored
    before the supervisor's report that it runs (server/reports.py) is applied."""
    if row["state"] not in ACTIVE_STATES or row["stage"] != Stage.TRAIN:
        return False
    step = latest.get("step")
    return isinstance(step, dict) and step.get("segment", 0) == (row["segment"] or 0)


def held_view(row: Row, now: float | None = None) -> dict[str, Any] | None:
    """{"at_step", "since", "until"} while the lab holds the run's trainer for its student
    (server/run_control.py hold_pair; workers/hold.py), else None: never once the hold's
    time is out, whoever forgot to clear it."""
    stored = row.get("held_json")
    if not stored:
        return None
    held = json.loads(stored)
    if float(held.get("until") or 0) <= (time.time() if now is None else now):
        return None
    return held


def run_view(
    row: Row,
    pair: Row,
    positions: Mapping[str, int],
    waits: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """`positions`: each queued run's place; `waits`: each queued run's estimated wait in
    seconds (server/queue_wait.py)."""
    stored = row["latest_json"] or "{}"
    latest = json.loads(stored)
    if "NaN" in stored or "Infinity" in stored:  # stored before ingest made those null (#24)
        latest = finite_or_null(latest)
    preset = json.loads(pair["preset_json"])
    knob = preset.get("knob") or {}
    state = row["state"]
    stage = row["stage"]
    if state == RunState.QUEUED:
        stage = Stage.QUEUED
    elif state == RunState.STOPPED:
        stage = Stage.STOPPED
    pending = pending_kill(row, latest)
    # A crash test or a preemption may hit it: training, and no earlier one pending.
    may_hit = training(row, latest) and pending is None
    held = held_view(row) if may_hit else None
    return {
        "id": row["id"],
        "label": row["label"],
        "state": state,
        "stage": stage,
        "stage_progress": row["stage_progress"],
        "queue_position": positions.get(row["id"]),
        "queue_wait_s": (waits or {}).get(row["id"]) if state == RunState.QUEUED else None,
        "step": row["step"],
        "steps": total_steps(pair, latest),
        "segment": row["segment"],
        "crashes": row["crashes"],
        "knob": {
            "name": knob.get("name"),
            "value": knob.get("a") if row["label"] == "A" else knob.get("b"),
        },
        "can_crash": may_hit,
        "can_preempt": may_hit,
        "pending_kill": pending,
        "held": held,
        "message": row["message"],
        "exit_code": row["exit_code"],
        "latest": {k: latest[k] for k in SHOWN_LATEST if k in latest},
        "ranks": ranks_view(row, latest, preset),
    }


def pair_view(
    pair: Row,
    runs: Sequence[Row],
    positions: Mapping[str, int],
    *,
    is_owner: bool,
    waits: Mapping[str, float | None] | None = None,
    start_times: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`start_times`: how long trainer starts take on this lab (StartTimes.summary)."""
    preset = json.loads(pair["preset_json"])
    knob = preset.get("knob") or {}
    return {
        "pair": pair["id"],
        "preset": preset,
        "knob": {
            "name": knob.get("name"),
            "a": knob.get("a"),
            "b": knob.get("b"),
            "text": preset.get("knob_text"),
        },
        "created_at": pair["created_at"],
        "owner": is_owner,
        "start_times": dict(start_times or {"median_s": None, "count": 0}),
        "runs": [run_view(r, pair, positions, waits) for r in runs],
    }


def restart_counts(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    """Each run's restarts by kind (RESTART_KINDS: crash tests, preemptions, lost hosts,
    unasked kills), from its restart events' rows (run_id, data); every kind is present."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        try:
            kind = restart_kind(json.loads(row["data"]))
        except (TypeError, ValueError):
            continue
        if kind is not None:
            counts = out.setdefault(row["run_id"], dict.fromkeys(RESTART_KINDS, 0))
            counts[kind] += 1
    return out


# An event's fields that are not its code's own (trainer/event_codes.py).
_NOT_OWN_FIELDS = frozenset(("v", "kind", "t", "segment", "level", "code", "text"))


def event_view(row: Row) -> dict[str, Any]:
    data = json.loads(row["data"])
    return {
        "id": row["id"],
        "t": row["t"],
        "segment": row["segment"],
        "level": data.get("level", "info"),
        "code": data.get("code"),
        "text": str(data.get("text", "")),
        "step": data.get("step", data.get("at_step")),
        "fields": {k: v for k, v in data.items() if k not in _NOT_OWN_FIELDS},
    }
