"""What a lesson's `[crash] mode` means to the lab, and the event the lab adds when a
restarted run trains from step 0 again.

- `crash_mode(pair)`: the mode stored with the pair's preset ("kill" when none).
- `chosen_mode(pair, asked)`: the mode a crash test uses: the lesson's, or one its
  `[crash] offer` lets a student pick (a lesson of several ranks offering "rank": kill
  one rank instead of the whole group); Conflict (409) naming what it offers for a
  registered mode it does not offer (the request is valid, the lesson says no), BadInput
  for a name no crash mode has.
- `preemption(preset_ref, label)`: the grace the lab gives a run between SIGTERM and
  SIGKILL when it preempts it (its config's `stop_grace`), and the lesson's session wall
  (`[crash] wall_step`, 0: none) at which it does so by itself.
- `fresh_start_allowed(preset_ref, label)`: the run's config lets a restart that finds no
  checkpoint train from scratch (on_missing_checkpoint = "fresh"; lesson 1.12's B), so its
  restart event must not say that it requires one.
- `crash_settings(preset_ref)`: what a crash test's restart changes for good: the lesson's
  `[crash] restart_ranks` as `ranks=N` (lesson 1.18 resumes on another world size); the
  supervisor takes them on at the first crash test (workers/launch.py).
- `launch_env(preset_ref, label, mode)`: the runs of a mode that waits for a save
  ("during_save") start with the checkpoint-pause hook (trainer/checkpoint_pause.py)
  holding each cadence checkpoint's write open, so that a crash test (which waits for the
  trainer to say it paused) lands inside the write.
- `started_over_events(store, batch)`: a run whose restarted segment begins at step 1
  (no checkpoint was resumed: it never saved one, or the lesson's trainer silently
  trained from scratch) gets one warning event from the lab naming its first loss next
  to ln(vocab), the loss of an untrained model, and how many steps were lost. The event
  lives in the database only (dedup key `lab:started_over:SEGMENT`): it is derived from
  the records file, which stays the trainer's and the supervisor's.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

from crashdrill.server.errors import BadInput, Conflict
from crashdrill.server.ingest import IngestBatch
from crashdrill.server.lessons.policy import during_save_pause
from crashdrill.server.storage.db import Row
from crashdrill.server.storage.store import NewRecord, Store
from crashdrill.trainer.checkpoint_pause import ENV as PAUSE_ENV
from crashdrill.trainer.config import ConfigError
from crashdrill.trainer.crash_modes import DEFAULT, NAMES, mode_named
from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.presets import PresetError, get_preset
from crashdrill.trainer.record_contract import VERSION
from crashdrill.workers.graceful_stop import PREEMPT_GRACE_S


def crash_mode(pair: Mapping[str, Any] | None) -> str:
    """The crash mode of a pair's lesson, from its stored preset (its name in the registry,
    trainer/crash_modes.py; the default for none or one no longer registered)."""
    if pair is None:
        return DEFAULT
    try:
        preset = json.loads(pair["preset_json"] or "{}")
    except (TypeError, ValueError):
        return DEFAULT
    crash = preset.get("crash") if isinstance(preset, dict) else None
    mode = crash.get("mode") if isinstance(crash, dict) else None
    return str(mode) if mode in NAMES else DEFAULT


def offered_modes(pair: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The modes a student may pick at Crash test: the lesson's own first, then those its
    `[crash] offer` names (registered ones only)."""
    mode = crash_mode(pair)
    try:
        crash = json.loads((pair or {}).get("preset_json") or "{}").get("crash") or {}
    except (TypeError, ValueError, AttributeError):
        crash = {}
    offer = crash.get("offer") if isinstance(crash, dict) else None
    extra = [m for m in offer if m in NAMES and m != mode] if isinstance(offer, list) else []
    return (mode, *extra)


def chosen_mode(pair: Mapping[str, Any] | None, asked: str | None) -> str:
    """The crash mode of a crash test that asked for `asked` (None: the lesson's own)."""
    offered = offered_modes(pair)
    if asked is None or asked == offered[0]:
        return offered[0]
    if asked not in NAMES:
        raise BadInput(f"crash_mode {asked!r} is no crash mode: one of {', '.join(NAMES)}")
    if asked not in offered:
        others = ", ".join(repr(m) for m in offered[1:])
        what = f"{offered[0]!r} (its [crash] mode) or {others}" if others else f"{offered[0]!r}"
        raise Conflict(
            f"crash_mode {asked!r} is not offered by this lesson: its Crash test kills with"
            f" {what}; a lesson offers more through its preset's [crash] offer"
        )
    return asked


def preemption(preset_ref: str, label: str) -> tuple[float, int]:
    """(grace in seconds, wall step) for a run of `preset_ref` (a frozen preset file or an
    id): its config's stop_grace and its lesson's [crash] wall_step (0: no wall)."""
    try:
        preset = get_preset(preset_ref)
        return float(preset.config_for(label).stop_grace), preset.crash.wall_step
    except (PresetError, ConfigError):
        return PREEMPT_GRACE_S, 0  # the trainer itself reports an unreadable preset


def fresh_start_allowed(preset_ref: str, label: str) -> bool:
    """Whether the run trains from scratch when a restart finds no checkpoint (its config's
    on_missing_checkpoint = "fresh") instead of refusing."""
    try:
        return get_preset(preset_ref).config_for(label).on_missing_checkpoint == "fresh"
    except (PresetError, ConfigError):
        return False  # the trainer itself reports an unreadable preset


def crash_settings(preset_ref: str) -> tuple[str, ...]:
    """The settings (`KEY=VALUE`) a crash test's restart of this lesson's runs takes on."""
    try:
        n = get_preset(preset_ref).crash.restart_ranks
    except PresetError:
        return ()  # the trainer itself reports an unreadable preset
    return (f"ranks={n}",) if n else ()


def launch_env(preset_ref: str, label: str, mode: str) -> dict[str, str]:
    """Environment for a run's trainer: the checkpoint pause of a lesson whose crash mode
    waits for a save (during_save)."""
    if not mode_named(mode).waits_for_save:
        return {}
    try:
        spec = during_save_pause(get_preset(preset_ref), label)
    except PresetError:
        return {}  # the trainer itself reports an unreadable preset
    return {PAUSE_ENV: spec} if spec else {}


def started_over_events(store: Store, batch: IngestBatch) -> list[tuple[int, NewRecord]]:
    """Insert the lab's event for each segment ≥ 1 of this batch that trained step 1 without
    resuming: its `resume` record (written before any step) names no checkpoint."""
    out: list[tuple[int, NewRecord]] = []
    for _rid, rec in batch.inserted:
        if rec.kind != "step" or rec.segment < 1 or rec.step != 1:
            continue
        row = store.run(batch.run_id)
        if row is None:
            return out
        resumed = store.records_of_kind(batch.run_id, "resume")
        if any(int(r["segment"]) == rec.segment and _from_checkpoint(r) for r in resumed):
            continue  # resumed from a checkpoint (maybe step 0's): the resume check covers it
        event = _started_over(store, row, rec)
        key = f"lab:started_over:{rec.segment}"
        new = NewRecord(key, rec.segment, "event", None, event["t"], json.dumps(event))
        out.extend(store.insert_records(batch.run_id, [new], int(row["ingest_offset"]), {}))
    return out


def _from_checkpoint(resume: Row) -> bool:
    try:
        return bool(json.loads(resume["data"]).get("path"))
    except (TypeError, ValueError, AttributeError):
        return False


def _started_over(store: Store, row: Row, rec: NewRecord) -> dict[str, Any]:
    data = json.loads(rec.data)
    loss = data.get("loss")
    run_rec = json.loads(row["latest_json"] or "{}").get("run") or {}
    vocab = run_rec.get("vocab")
    earlier = [
        int(r["step"])
        for r in store.step_losses(str(row["id"]))
        if int(r["segment"]) < rec.segment and r["step"] is not None
    ]
    lost = max(earlier, default=0)
    text = f"Segment {rec.segment} trained from step 0 again"
    if isinstance(loss, int | float):
        text += f": its first loss is {loss:.3f}"
        if isinstance(vocab, int) and vocab > 1:
            text += (
                f", back at ln(vocab) = ln {vocab} = {math.log(vocab):.3f}, the loss of a"
                " model that has never seen a token"
            )
    text += (
        f". The {lost} steps trained before the crash are gone, and training from scratch"
        " is easy to miss: the process started, printed its usual lines, and the loss curve"
        " simply began again."
    )
    event = build_event(
        "started_over",
        text,
        segment=rec.segment,
        at_step=lost,
        lost_steps=lost,
        first_loss=loss if isinstance(loss, int | float) else None,
        vocab=vocab if isinstance(vocab, int) else None,
        source="lab",
    )
    return {"v": VERSION, "t": time.time(), **event}
