"""An event is made one way (trainer/event_record.py): `event()` and the RecordWriter refuse
what its code in the registry does not say, naming what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.event_record import event


def test_an_event_gets_its_code_s_default_level_and_carries_its_fields() -> None:
    e = event("mirror_failed", "Could not copy.", segment=2, step=50)
    assert e == {
        "kind": "event",
        "segment": 2,
        "level": "warn",
        "code": "mirror_failed",
        "text": "Could not copy.",
        "step": 50,
    }
    assert "segment" not in event("fresh_start", "Started over.")


def test_an_unknown_code_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown event code 'checkpointed'; known: .*checkpoint"):
        event("checkpointed", "Checkpoint at step 5.")


def test_a_missing_field_is_refused_naming_it_and_its_type() -> None:
    with pytest.raises(ValueError, match=r"event 'resumed': missing field 'missing' \(list\[str\]"):
        event("resumed", "Resumed at step 5.", step=5)


def test_a_field_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ValueError, match="field 'step' is '5', not a int"):
        event("mirror_failed", "Could not copy.", step="5")
    with pytest.raises(ValueError, match="field 'step' is True, not a int"):
        event("mirror_failed", "Could not copy.", step=True)
    with pytest.raises(ValueError, match=r"field 'parts' is \[1\], not a list\[str\]"):
        event(
            "checkpoint", "Ckpt.", step=1, bytes=1, seconds=0, persist_seconds=0, mode="sync",
            parts=[1],
        )  # fmt: skip


def test_a_field_the_code_does_not_have_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown field.* seconds; allowed: step"):
        event("mirror_failed", "Could not copy.", step=5, seconds=1.0)


def test_a_level_the_code_is_not_written_at_is_refused() -> None:
    with pytest.raises(ValueError, match="level 'info' not one of warn"):
        event("fresh_start", "Started over.", level="info")


def test_optional_fields_may_be_absent_and_nullable_ones_null() -> None:
    base: dict[str, Any] = {
        "at_step": 7,
        "resume_from": None,
        "lost_steps": 7,
        "crash_mode": "kill",
    }
    assert "save_step" not in event("crash", "Crash test.", **base)
    assert event("crash", "Crash test.", save_step=5, **base)["save_step"] == 5
    assert event("finished", "Finished.", steps=4, best_val=None)["best_val"] is None
    assert event("finished", "Finished.", steps=4, best_val=float("nan"))  # JSON: null


def test_the_record_writer_refuses_an_event_outside_the_registry(tmp_path: Path) -> None:
    from crashdrill.trainer.records import RecordWriter, read_records

    rec = RecordWriter(tmp_path, segment=0)
    with pytest.raises(KeyError, match="unknown event code 'saved'"):
        rec.write("event", text="Checkpoint at step 5.", level="info", code="saved")
    with pytest.raises(ValueError, match="missing field 'steps'"):
        rec.event("finished", "Finished.", best_val=None)
    rec.event("finished", "Finished 4 steps.", steps=4, best_val=2.5)
    rec.close()
    (written,), _ = read_records(tmp_path / "records.jsonl")
    assert (written["code"], written["steps"], written["segment"]) == ("finished", 4, 0)
