"""Several labs on one database (schema 2): each lab's Store sees only its own runs to
schedule, adopt and resume, and only its own machine's telemetry; rows from before labs
existed go to the first lab that starts. On SQLite and on a real Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crashdrill.server.settings import SettingsError, _kept_token
from crashdrill.server.storage.db import Database
from crashdrill.server.storage.store import Store
from tests.support.postgres import open_test_database
from tests.support.rows import present


@pytest.fixture(params=["sqlite", "postgres"])
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Database]:
    db = open_test_database(request.param, tmp_path, request)
    db.migrate()
    yield db
    db.close()


def pair(store: Store, pair_id: str, tmp_path: Path) -> None:
    runs = [(f"{pair_id}-{label}", label, str(tmp_path / pair_id / label)) for label in "AB"]
    store.create_pair(pair_id, "owner", "quick", {"knob": {}}, runs)


def test_each_lab_schedules_only_its_own_runs(db: Database, tmp_path: Path) -> None:
    a, b = Store(db, "lab-a"), Store(db, "lab-b")
    pair(a, "pa", tmp_path)
    pair(b, "pb", tmp_path)
    a.update_run("pa-A", state="running")
    assert [r["id"] for r in a.runs_in(["queued"])] == ["pa-B"]
    assert [r["id"] for r in a.runs_in(["running"])] == ["pa-A"]
    assert [r["id"] for r in b.runs_in(["queued"])] == ["pb-A", "pb-B"]
    assert b.runs_in(["running"]) == []
    # Lookups by id are not scoped: a pair id is the capability.
    assert present(b.run("pa-A"), "run pa-A")["lab"] == "lab-a"
    assert [r["id"] for r in b.runs_of_pair("pa")] == ["pa-A", "pa-B"]


def test_each_lab_reads_and_prunes_only_its_own_telemetry(db: Database) -> None:
    a, b = Store(db, "lab-a"), Store(db, "lab-b")
    for i in range(250):
        a.insert_telemetry(float(i), f'{{"lab":"a","i":{i}}}', keep=30)
        if i < 10:
            b.insert_telemetry(float(i), f'{{"lab":"b","i":{i}}}', keep=30)
    assert present(a.latest_telemetry(), "telemetry row")["data"] == '{"lab":"a","i":249}'
    assert present(b.latest_telemetry(), "telemetry row")["data"] == '{"lab":"b","i":9}'
    count = "SELECT COUNT(*) AS n FROM telemetry WHERE lab = ?"
    # Pruned at the 100th and 200th insert to the newest 30 (+ the 50 since).
    assert db.one(count, ("lab-a",)) == {"n": 80}
    assert db.one(count, ("lab-b",)) == {"n": 10}, "lab a's pruning left lab b alone"


def test_rows_from_before_labs_go_to_the_first_lab_that_starts(
    db: Database, tmp_path: Path
) -> None:
    legacy = Store(db, "")
    pair(legacy, "old", tmp_path)
    db.run("UPDATE runs SET lab = NULL")  # as the migration to schema 2 leaves them
    db.run("INSERT INTO telemetry (t, data) VALUES (?, ?)", (1.0, "{}"))
    first, second = Store(db, "lab-a"), Store(db, "lab-b")
    assert first.claim_unowned() == 2
    assert second.claim_unowned() == 0
    assert [r["id"] for r in first.runs_in(["queued"])] == ["old-A", "old-B"]
    assert second.runs_in(["queued"]) == []
    assert first.latest_telemetry() is not None and second.latest_telemetry() is None


def test_a_lab_id_is_made_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "data" / "lab_id"
    made = _kept_token(path, 12)
    assert len(made) >= 16 and _kept_token(path, 12) == made
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("")
    with pytest.raises(SettingsError, match="lab_id is empty: delete it"):
        _kept_token(path, 12)


def test_a_queued_run_is_taken_once_by_the_scheduler_or_a_stop(
    db: Database, tmp_path: Path
) -> None:
    store = Store(db, "lab-a")
    pair(store, "p", tmp_path)
    assert store.update_run_if("p-A", "queued", state="stopped") is True
    assert store.update_run_if("p-A", "queued", state="starting") is False  # the stop won
    assert present(store.run("p-A"), "run p-A")["state"] == "stopped"
    with pytest.raises(ValueError, match="not a run column"):
        store.update_run_if("p-B", "queued", owner="x")
