"""Every query the server makes, in one place: pairs, runs, records, telemetry.

Plain SQL with `?` parameters through `Database.run`, written once for SQLite and
Postgres (the rules are in db.py's docstring: for one, never `IN ()`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crashdrill.server.db import Database, Row

ACTIVE_STATES = ("starting", "running", "restarting")
TERMINAL_STATES = ("finished", "failed", "stopped")
RUN_STATES = ("queued", *ACTIVE_STATES, *TERMINAL_STATES)
INSERT_BATCH = 500  # records per INSERT: 3500 parameters, far below both engines' limits

_RUN_COLUMNS = frozenset(
    {
        "state",
        "started_at",
        "ended_at",
        "pid",
        "pid_started",
        "exit_code",
        "stage",
        "stage_progress",
        "step",
        "segment",
        "crashes",
        "ingest_offset",
        "latest_json",
        "message",
    }
)


@dataclass(frozen=True)
class NewRecord:
    """One line of records.jsonl, parsed, ready to insert."""

    dedup_key: str
    segment: int
    kind: str
    step: int | None
    t: float | None
    data: str  # the record as JSON text


class Store:
    """Queries scoped to one lab: the runs it schedules, adopts and resumes, and its
    machine's telemetry, carry `lab` (labs sharing a database leave each other alone).
    Lookups by id (a pair, a run, its records) are not scoped: ids are unguessable."""

    def __init__(self, db: Database, lab: str = "") -> None:
        self.db = db
        self.lab = lab
        self._telemetry_inserts = 0

    def claim_unowned(self) -> int:
        """Give rows from before labs existed (schema 1) to this lab; how many runs."""
        with self.db.transaction():
            n = self.db.run("SELECT COUNT(*) AS n FROM runs WHERE lab IS NULL")[0]["n"]
            if n:
                self.db.run("UPDATE runs SET lab = ? WHERE lab IS NULL", (self.lab,))
            self.db.run("UPDATE telemetry SET lab = ? WHERE lab IS NULL", (self.lab,))
        return int(n)

    # ---- pairs and runs -------------------------------------------------------------

    def create_pair(
        self,
        pair_id: str,
        owner: str,
        preset: str,
        preset_public: dict[str, Any],
        runs: Sequence[tuple[str, str, str]],
    ) -> None:
        """A pair and its runs (id, label, run_dir), all queued, in one transaction."""
        now = time.time()
        with self.db.transaction():
            self.db.run(
                "INSERT INTO pairs (id, owner, preset, preset_json, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (pair_id, owner, preset, json.dumps(preset_public), now),
            )
            for i, (run_id, label, run_dir) in enumerate(runs):
                self.db.run(
                    "INSERT INTO runs"
                    " (id, pair_id, label, preset, run_dir, state, queued_at, lab)"
                    " VALUES (?, ?, ?, ?, ?, 'queued', ?, ?)",
                    (run_id, pair_id, label, preset, run_dir, now + i * 1e-6, self.lab),
                )

    def pair(self, pair_id: str) -> Row | None:
        return self.db.one("SELECT * FROM pairs WHERE id = ?", (pair_id,))

    def pairs_by_id(self, pair_ids: Sequence[str]) -> dict[str, Row]:
        return self._by_id("pairs", pair_ids)

    def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, Row]:
        return self._by_id("runs", run_ids)

    def _by_id(self, table: str, ids: Sequence[str]) -> dict[str, Row]:
        """Rows of `table` by id, one statement per 500 ids (one round trip, not one each)."""
        found: dict[str, Row] = {}
        for start in range(0, len(ids), INSERT_BATCH):
            chunk = ids[start : start + INSERT_BATCH]
            marks = ", ".join("?" for _ in chunk)
            for row in self.db.run(f"SELECT * FROM {table} WHERE id IN ({marks})", chunk):
                found[row["id"]] = row
        return found

    def runs_of_pair(self, pair_id: str) -> list[Row]:
        return self.db.run("SELECT * FROM runs WHERE pair_id = ? ORDER BY label", (pair_id,))

    def active_pairs_of(self, owner: str) -> int:
        """Pairs of `owner` with a run that is queued or has not ended."""
        row = self.db.one(
            "SELECT COUNT(DISTINCT p.id) AS n FROM pairs p JOIN runs r ON r.pair_id = p.id"
            " WHERE p.owner = ? AND r.state IN ('queued', 'starting', 'running', 'restarting')",
            (owner,),
        )
        return int(row["n"]) if row else 0

    def run(self, run_id: str) -> Row | None:
        return self.db.one("SELECT * FROM runs WHERE id = ?", (run_id,))

    def owner_of_run(self, run_id: str) -> str | None:
        row = self.db.one(
            "SELECT p.owner FROM runs r JOIN pairs p ON p.id = r.pair_id WHERE r.id = ?",
            (run_id,),
        )
        return row["owner"] if row else None

    def runs_in(self, states: Iterable[str]) -> list[Row]:
        states = tuple(states)
        if not states:
            return []
        marks = ", ".join("?" for _ in states)
        return self.db.run(
            f"SELECT * FROM runs WHERE lab = ? AND state IN ({marks}) ORDER BY queued_at, label",
            (self.lab, *states),
        )

    def update_run(self, run_id: str, **fields: Any) -> None:
        unknown = set(fields) - _RUN_COLUMNS
        if unknown:
            raise ValueError(f"not a run column: {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.run(f"UPDATE runs SET {sets} WHERE id = ?", (*fields.values(), run_id))

    def update_run_if(self, run_id: str, expected: str, /, **fields: Any) -> bool:
        """`update_run` only while the run's state is `expected`; whether it was (one statement:
        the scheduler and a Stop click on another thread cannot both take a queued run)."""
        unknown = set(fields) - _RUN_COLUMNS
        if unknown:
            raise ValueError(f"not a run column: {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in fields)
        rows = self.db.run(
            f"UPDATE runs SET {sets} WHERE id = ? AND state = ? RETURNING id",
            (*fields.values(), run_id, expected),
        )
        return bool(rows)

    # ---- records --------------------------------------------------------------------

    def insert_records(
        self, run_id: str, records: Sequence[NewRecord], new_offset: int, run_fields: dict[str, Any]
    ) -> list[tuple[int, NewRecord]]:
        """Insert records and move the ingest offset in one transaction.

        Records already present (same dedup key) are skipped: ingest is idempotent.
        Returns (id, record) of the rows inserted now, in id (= file) order.

        One multi-row INSERT per INSERT_BATCH records: against a remote Postgres each
        statement costs a network round trip, paid on the event loop's thread.
        """
        if not records:
            self.update_run(run_id, ingest_offset=new_offset, **run_fields)  # one statement
            return []
        if self.db.dialect == "postgres" and len(records) <= INSERT_BATCH:
            return self._insert_records_one_statement(run_id, records, new_offset, run_fields)
        inserted = []
        with self.db.transaction():
            for start in range(0, len(records), INSERT_BATCH):
                batch = records[start : start + INSERT_BATCH]
                first: dict[str, NewRecord] = {}
                for rec in batch:
                    first.setdefault(rec.dedup_key, rec)  # a key twice: the first one counts
                rows = self.db.run(
                    "INSERT INTO records (run_id, dedup_key, segment, kind, step, t, data)"
                    f" VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?)'] * len(batch))}"
                    " ON CONFLICT (run_id, dedup_key) DO NOTHING RETURNING id, dedup_key",
                    [
                        v
                        for r in batch
                        for v in (run_id, r.dedup_key, r.segment, r.kind, r.step, r.t, r.data)
                    ],
                )
                inserted += sorted((int(row["id"]), first[row["dedup_key"]]) for row in rows)
            self.update_run(run_id, ingest_offset=new_offset, **run_fields)
        return inserted

    def _insert_records_one_statement(
        self, run_id: str, records: Sequence[NewRecord], new_offset: int, run_fields: dict[str, Any]
    ) -> list[tuple[int, NewRecord]]:
        """Postgres: the INSERT and the run's UPDATE as one statement (data-modifying
        WITH), atomic on its own: one round trip where BEGIN … COMMIT takes four. SQLite
        has no data-modifying WITH, and needs no round trips."""
        fields = {"ingest_offset": new_offset, **run_fields}
        unknown = set(fields) - _RUN_COLUMNS
        if unknown:
            raise ValueError(f"not a run column: {sorted(unknown)}")
        first: dict[str, NewRecord] = {}
        for rec in records:
            first.setdefault(rec.dedup_key, rec)  # a key twice: the first one counts
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(records))
        sets = ", ".join(f"{k} = ?" for k in fields)
        rows = self.db.run(
            "WITH ins AS (INSERT INTO records (run_id, dedup_key, segment, kind, step, t, data)"
            f" VALUES {values} ON CONFLICT (run_id, dedup_key) DO NOTHING"
            " RETURNING id, dedup_key),"
            f" upd AS (UPDATE runs SET {sets} WHERE id = ? RETURNING id)"
            " SELECT id, dedup_key FROM ins",
            [
                *(
                    v
                    for r in records
                    for v in (run_id, r.dedup_key, r.segment, r.kind, r.step, r.t, r.data)
                ),
                *fields.values(),
                run_id,
            ],
        )
        return sorted((int(row["id"]), first[row["dedup_key"]]) for row in rows)

    def records(
        self, run_id: str, kinds: Sequence[str] | None, after: int, limit: int
    ) -> list[Row]:
        sql = "SELECT id, data FROM records WHERE run_id = ? AND id > ?"
        params: list[Any] = [run_id, after]
        if kinds:
            sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
            params.extend(kinds)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        return self.db.run(sql, params)

    def records_of_runs(self, run_ids: Sequence[str], after: int, limit: int) -> list[Row]:
        if not run_ids:
            return []
        marks = ", ".join("?" for _ in run_ids)
        return self.db.run(
            f"SELECT id, run_id, data FROM records WHERE run_id IN ({marks}) AND id > ?"
            " ORDER BY id LIMIT ?",
            (*run_ids, after, limit),
        )

    def step_losses(self, run_id: str) -> list[Row]:
        """(segment, step, data) of every step record, for the resume check."""
        return self.db.run(
            "SELECT segment, step, data FROM records WHERE run_id = ? AND kind = 'step'"
            " ORDER BY segment, step",
            (run_id,),
        )

    def records_of_kind(self, run_id: str, kind: str) -> list[Row]:
        return self.db.run(
            "SELECT id, segment, step, t, data FROM records WHERE run_id = ? AND kind = ?"
            " ORDER BY id",
            (run_id, kind),
        )

    # ---- telemetry ------------------------------------------------------------------

    def insert_telemetry(self, t: float, data: str, keep: int) -> int:
        """Store a sample of this lab's machine; every 100th insert prunes this lab's
        samples to the newest `keep`."""
        rows = self.db.run(
            "INSERT INTO telemetry (t, data, lab) VALUES (?, ?, ?) RETURNING id",
            (t, data, self.lab),
        )
        new_id = int(rows[0]["id"])
        self._telemetry_inserts += 1
        if self._telemetry_inserts % 100 == 0:
            edge = self.db.one(
                "SELECT id FROM telemetry WHERE lab = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                (self.lab, keep),
            )
            if edge is not None:
                self.db.run(
                    "DELETE FROM telemetry WHERE lab = ? AND id <= ?", (self.lab, edge["id"])
                )
        return new_id

    def latest_telemetry(self) -> Row | None:
        return self.db.one(
            "SELECT id, t, data FROM telemetry WHERE lab = ? ORDER BY id DESC LIMIT 1",
            (self.lab,),
        )
