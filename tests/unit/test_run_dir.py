"""RunDir.append_records (workers/run_dir.py), the supervisor's writer of a run's records:
events pass the trainer's check, and a torn last line is ended the one way both writers of
records.jsonl end it (trainer/run_files.py `torn_tail`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.event_record import event
from crashdrill.trainer.records import RecordWriter
from crashdrill.trainer.run_files import RECORDS_FILE, read_records
from crashdrill.workers.run_dir import RunDir


def _by_the_trainer(run_dir: Path, rec: dict[str, Any]) -> None:
    writer = RecordWriter(run_dir, segment=1)
    fields = {k: v for k, v in rec.items() if k not in ("kind", "segment")}
    writer.event(fields.pop("code"), fields.pop("text"), **fields)
    writer.close()


def _by_the_supervisor(run_dir: Path, rec: dict[str, Any]) -> None:
    RunDir(run_dir).append_records([rec])


WRITERS: dict[str, Callable[[Path, dict[str, Any]], None]] = {
    "RecordWriter": _by_the_trainer,
    "RunDir.append_records": _by_the_supervisor,
}
TORN = '{"v":1,"kind":"step","segment":0,"step":1}\n{"v":1,"kind":"st'


@pytest.mark.parametrize("writer", WRITERS)
def test_both_writers_end_a_torn_last_line_before_their_first_record(
    tmp_path: Path, writer: str
) -> None:
    (tmp_path / RECORDS_FILE).write_text(TORN)
    WRITERS[writer](tmp_path, event("mirror_unreachable", "after the kill", segment=1))
    lines = (tmp_path / RECORDS_FILE).read_text().split("\n")
    assert lines[1] == '{"v":1,"kind":"st'  # one bad line, which readers skip
    assert json.loads(lines[2])["text"] == "after the kill"
    assert lines[3:] == [""]
    recs, _ = read_records(tmp_path / RECORDS_FILE)
    assert [r["kind"] for r in recs] == ["step", "event"]


@pytest.mark.parametrize("writer", WRITERS)
def test_both_writers_add_no_blank_line_after_a_whole_one(tmp_path: Path, writer: str) -> None:
    (tmp_path / RECORDS_FILE).write_text(TORN.split("\n")[0] + "\n")
    WRITERS[writer](tmp_path, event("mirror_unreachable", "next", segment=1))
    assert len((tmp_path / RECORDS_FILE).read_text().splitlines()) == 2


@pytest.mark.parametrize("writer", WRITERS)
def test_both_writers_refuse_an_event_of_an_unknown_code(tmp_path: Path, writer: str) -> None:
    bad = {"kind": "event", "segment": 0, "level": "info", "code": "made_up", "text": "hi"}
    with pytest.raises(KeyError, match="made_up"):
        WRITERS[writer](tmp_path, bad)
    assert not (tmp_path / RECORDS_FILE).exists() or (tmp_path / RECORDS_FILE).read_text() == ""


def test_an_event_with_a_field_its_code_does_not_have_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    rd = RunDir(tmp_path)
    good = event("mirror_unreachable", "fine", segment=0)
    with pytest.raises(ValueError):
        rd.append_records([good, {**good, "surprise": 1}])
    assert read_records(rd.records)[0] == []  # not even the good one: one write or none


def test_records_other_than_events_pass_and_non_finite_numbers_are_written_as_null(
    tmp_path: Path,
) -> None:
    rd = RunDir(tmp_path)
    rd.append_records([{"kind": "step", "segment": 0, "step": 3, "loss": math.nan}])
    (rec,), _ = read_records(rd.records)
    assert (rec["v"], rec["step"], rec["loss"]) == (1, 3, None)
    assert "NaN" not in rd.records.read_text()
