"""Ingest of records.jsonl (written here in the documented format) into the database."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from crashdrill.server.ingest import ingest_run, parse_lines
from crashdrill.server.storage.store import NewRecord, Store
from tests.support.postgres import open_test_database
from tests.support.rows import present


def line(kind: str, segment: int = 0, **fields: Any) -> str:
    return json.dumps({"v": 1, "kind": kind, "t": 1.0, "segment": segment, **fields}) + "\n"


@pytest.fixture(params=["sqlite", "postgres"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    db = open_test_database(request.param, tmp_path, request)
    db.migrate()
    s = Store(db)
    s.create_pair("p1", "owner", "quick", {"knob": {}}, [("r1", "A", str(tmp_path / "r1"))])
    (tmp_path / "r1").mkdir()
    yield s
    db.close()


def append(store: Store, text: str) -> None:
    path = Path(present(store.run("r1"), "run r1")["run_dir"]) / "records.jsonl"
    with open(path, "a") as f:
        f.write(text)


def ingest_all(store: Store) -> int:
    n = 0
    while (batch := ingest_run(store, present(store.run("r1"), "run r1"))) is not None:
        n += len(batch.inserted)
    return n


def test_records_are_stored_and_the_run_summarised(store: Store) -> None:
    append(store, line("stage", stage="train", progress=0.0))
    append(store, "".join(line("step", step=s, loss=1.0, loss_bits=1065353216) for s in (1, 2)))
    append(store, line("event", text="hello"))
    assert ingest_all(store) == 4
    run = store.run("r1")
    assert run is not None
    assert (run["stage"], run["step"], run["segment"]) == ("train", 2, 0)
    assert json.loads(run["latest_json"])["step"]["step"] == 2
    assert [r["id"] for r in store.records("r1", ["step"], 0, 10)] == [2, 3]


def test_ingest_is_idempotent_when_the_offset_is_lost(store: Store) -> None:
    append(store, "".join(line("step", step=s, loss=1.0) for s in range(1, 6)))
    append(store, line("event", text="a") + line("event", text="a"))
    assert ingest_all(store) == 7
    store.update_run("r1", ingest_offset=0)  # as if the server died before saving it
    assert ingest_all(store) == 0
    assert len(store.records("r1", None, 0, 100)) == 7


def test_a_line_without_its_newline_waits(store: Store) -> None:
    full = line("step", step=1, loss=1.0)
    append(store, full + full.replace("1.0", "2.0")[:20])
    assert ingest_all(store) == 1
    offset = present(store.run("r1"), "run r1")["ingest_offset"]
    assert offset == len(full)
    append(store, line("step", step=2, loss=2.0)[20:])
    assert ingest_all(store) == 1


def test_a_torn_line_is_skipped_and_the_rest_kept(store: Store) -> None:
    append(store, line("step", step=1, loss=1.0) + '{"v":1,"ki\n' + line("step", step=2))
    assert ingest_all(store) == 2


def test_a_line_no_database_column_can_hold_is_skipped_not_retried_forever(
    store: Store,
) -> None:
    """A step or segment past 64 bits, a time past a double, or text with a lone UTF-16
    surrogate (which neither SQLite nor Postgres can store) once made every ingest pass
    fail on the same chunk, so the run's records stopped for good."""
    poison = [
        line("step", step=2**63, loss=1.0),
        line("step", 2**64, step=3, loss=1.0),
        line("step", step=-(2**63) - 1, loss=1.0),
        line("event", text="far future").replace('"t": 1.0', f'"t": {10**400}'),
        line("ev\ud800nt", text="a lone surrogate in the kind"),
        line("stage", stage="tr\udfffain", progress=0.5),
    ]
    append(store, line("step", step=1, loss=1.0) + "".join(poison) + line("step", step=2))
    batches = []
    while (batch := ingest_run(store, present(store.run("r1"), "run r1"))) is not None:
        batches.append(batch)
    assert sum(len(b.inserted) for b in batches) == 2
    assert sum(b.bad_lines for b in batches) == len(poison)
    kept = store.records("r1", None, 0, 100)
    assert [json.loads(r["data"])["step"] for r in kept] == [1, 2]
    assert present(store.run("r1"), "run r1")["step"] == 2
    # The largest values a column holds are kept as they are.
    big = 2**63 - 1
    append(store, line("step", step=big, loss=1.0) + line("event", t=1e308, text="\ud7ff"))
    assert ingest_all(store) == 2
    assert present(store.run("r1"), "run r1")["step"] == big


def test_the_same_step_in_a_new_segment_is_a_new_row(store: Store) -> None:
    append(store, line("step", 0, step=5, loss=1.0) + line("step", 1, step=5, loss=1.0))
    assert ingest_all(store) == 2
    assert [r["segment"] for r in store.step_losses("r1")] == [0, 1]


def test_parse_lines_reports_consumed_bytes_and_bad_lines() -> None:
    chunk = b'{"kind":"x"}\n[1]\nnot json\n{"kind":"y"'
    parsed, consumed, bad = parse_lines(chunk, 100)
    assert [p.value["kind"] for p in parsed] == ["x"]
    assert consumed == chunk.rindex(b"\n") + 1 and bad == 2
    assert parsed[0].record.dedup_key == "@100"


def test_a_line_that_is_not_utf8_is_counted_bad_and_the_next_line_keeps_its_offset_key() -> None:
    chunk = b'\xff\xfe{"kind":"x"}\n{"kind":"y"}\n'
    parsed, consumed, bad = parse_lines(chunk, 100)
    assert [p.value["kind"] for p in parsed] == ["y"] and bad == 1
    assert consumed == len(chunk)
    assert parsed[0].record.dedup_key == "@115"  # 2 bad bytes, 12 of JSON, its newline


def test_a_big_batch_with_a_repeated_key_is_stored_once_in_file_order(store: Store) -> None:
    def rec(step: int, loss: float) -> NewRecord:
        return NewRecord(f"0:{step}:step", 0, "step", step, 1.0, json.dumps({"loss": loss}))

    batch = [rec(s, 1.0) for s in range(1, 1201)] + [rec(7, 2.0)]  # over INSERT_BATCH
    inserted = store.insert_records("r1", batch, 123, {})
    assert [r.step for _, r in inserted] == list(range(1, 1201))
    assert [i for i, _ in inserted] == sorted(i for i, _ in inserted)
    assert store.insert_records("r1", batch[:10], 456, {}) == []  # all there already
    rows = store.records("r1", ["step"], 0, 5000)
    assert len(rows) == 1200 and json.loads(rows[6]["data"]) == {"loss": 1.0}
    assert present(store.run("r1"), "run r1")["ingest_offset"] == 456


def test_a_small_batch_is_one_statement_on_postgres_with_the_same_result(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a remote Postgres each statement is a round trip: a pass's records and the
    run's new offset go in one (a transaction would take four)."""
    statements: list[str] = []
    run = store.db.run

    def counted(sql: str, p: Sequence[Any] = ()) -> list[dict[str, Any]]:
        statements.append(sql)
        return run(sql, p)

    monkeypatch.setattr(store.db, "run", counted)

    def rec(step: int, loss: float) -> NewRecord:
        return NewRecord(f"0:{step}:step", 0, "step", step, 1.0, json.dumps({"loss": loss}))

    inserted = store.insert_records("r1", [rec(1, 1.0), rec(2, 1.0), rec(1, 9.0)], 10, {"step": 2})
    assert [(r.step, json.loads(r.data)["loss"]) for _, r in inserted] == [(1, 1.0), (2, 1.0)]
    assert [i for i, _ in inserted] == sorted(i for i, _ in inserted)
    again = store.insert_records("r1", [rec(2, 5.0), rec(3, 1.0)], 20, {"step": 3})
    assert [r.step for _, r in again] == [3] and again[0][0] > inserted[-1][0]
    assert store.insert_records("r1", [], 30, {}) == []
    if store.db.dialect == "postgres":
        assert len(statements) == 3, statements
    row = store.run("r1")
    assert row is not None and (row["ingest_offset"], row["step"]) == (30, 3)
    assert [json.loads(r["data"])["loss"] for r in store.records("r1", ["step"], 0, 10)] == [
        1.0,
        1.0,
        1.0,
    ]


def started_over_after(store: Store, resume: dict[str, Any]) -> list[str]:
    from crashdrill.server.lessons.crash_effects import started_over_events

    append(store, line("run", vocab=256))
    append(store, "".join(line("step", step=s, loss=2.0) for s in (1, 2, 3)))
    append(store, line("resume", segment=1, **resume))
    append(store, line("step", segment=1, step=1, loss=5.58))
    codes = []
    while (batch := ingest_run(store, present(store.run("r1"), "run r1"))) is not None:
        for _rid, rec in started_over_events(store, batch):
            codes.append(json.loads(rec.data)["code"])
    return codes


def test_a_restart_that_trains_step_1_without_a_checkpoint_gets_the_labs_warning(
    store: Store,
) -> None:
    assert started_over_after(store, {"from_step": 0, "path": None}) == ["started_over"]


def test_a_resume_from_the_step_0_checkpoint_is_not_called_a_fresh_start(store: Store) -> None:
    resumed = {"from_step": 0, "path": "/r1/ckpt/step-00000000", "missing": []}
    assert started_over_after(store, resumed) == []
