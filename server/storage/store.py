"""Every query the server makes, in one place: pairs, runs, records, telemetry.

Plain SQL with `?` parameters through `Database.run`, written once for SQLite and
Postgres (the rules are in db.py's docstring: for one, never `IN ()`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crashdrill.server.storage.db import Database, Row
from crashdrill.server.storage.sql_text import set_clause
from crashdrill.workers.launch import ENDED


class RunState(StrEnum):
    """A run's state, the one definition; the value is what the database stores and the API
    serves (server/api/schemas.py's RunState is derived from RUN_STATES). Code names a state
    as `RunState.QUEUED`, a group as ACTIVE_STATES and the others below: no module spells
    one as a string (tests/unit/test_run_states.py).

    queued → starting → running ⇄ restarting → finished | failed | stopped | diverged.
    The server queues and starts a run; from then on its supervisor reports the rest
    (workers/launch.py's State, whose ended ones are ENDED).
    """

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    DIVERGED = "diverged"


# A trainer has been started and the run is not over.
ACTIVE_STATES = (RunState.STARTING, RunState.RUNNING, RunState.RESTARTING)
# Over: finished, failed, stopped, diverged (the supervisor's ENDED; a state it adds that is
# not a RunState fails here, at import).
TERMINAL_STATES = tuple(RunState(s) for s in ENDED)
LIVE_STATES = (RunState.QUEUED, *ACTIVE_STATES)  # a run that is not over
RUN_STATES = (*LIVE_STATES, *TERMINAL_STATES)  # every RunState, in the order a run lives them


def run_states_json() -> dict[str, list[str]]:
    """The states and their groups, as GET /api/record-kinds serves them to the page."""
    return {
        "all": list(RUN_STATES),
        "live": list(LIVE_STATES),
        "active": list(ACTIVE_STATES),
        "terminal": list(TERMINAL_STATES),
    }


def sql_list(states: Sequence[str]) -> str:
    """`'queued', 'starting'`: states as SQL literals, for a query's IN list. Only for the
    constants above (never for input): queries name their states from this one home."""
    unknown = [s for s in states if s not in RUN_STATES]
    if unknown:
        raise ValueError(f"not run states: {unknown}; the states are {', '.join(RUN_STATES)}")
    return ", ".join(f"'{s}'" for s in states)


_LIVE_IN = sql_list(LIVE_STATES)


def marks(values: Sequence[object]) -> str:
    """`?, ?, ?` for an IN list of these values (never empty)."""
    return ", ".join("?" for _ in values)


def state_rank(state: str) -> int:
    """A run's states only move forward: queued 0, starting 1, running and restarting 2
    (back and forth), ended 3 (server/stream/fanout.py drops a view ranked below one sent)."""
    if state in TERMINAL_STATES:
        return 3
    before: dict[str, int] = {RunState.QUEUED: 0, RunState.STARTING: 1}
    return before.get(state, 2)


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
        "detail",
        "ckpt_deleted_at",
        "pending_kill_json",
        "held_json",
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
        client: str | None = None,
        disk_bytes: int | None = None,
    ) -> None:
        """A pair and its runs (id, label, run_dir), all queued, in one transaction;
        `client`: the address it came from; `disk_bytes`: what its runs will write."""
        now = time.time()
        with self.db.transaction():
            self.db.run(
                "INSERT INTO pairs (id, owner, preset, preset_json, created_at, client,"
                " disk_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (pair_id, owner, preset, json.dumps(preset_public), now, client, disk_bytes),
            )
            queued = RunState.QUEUED
            for i, (run_id, label, run_dir) in enumerate(runs):
                self.db.run(
                    "INSERT INTO runs"
                    " (id, pair_id, label, preset, run_dir, state, queued_at, lab)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, pair_id, label, preset, run_dir, queued, now + i * 1e-6, self.lab),
                )

    def set_prediction(self, pair_id: str, prediction_json: str) -> None:
        """The owner's prediction (server/lessons/predictions.py); a new one replaces the old."""
        self.db.run(
            "UPDATE pairs SET prediction_json = ?, outcome_json = NULL WHERE id = ?",
            (prediction_json, pair_id),
        )

    def set_outcome(self, pair_id: str, outcome_json: str) -> None:
        self.db.run("UPDATE pairs SET outcome_json = ? WHERE id = ?", (outcome_json, pair_id))

    def predicted_pairs(self, limit: int) -> list[Row]:
        """This lab's pairs with a prediction, the newest `limit`, oldest first."""
        rows = self.db.run(
            "SELECT * FROM pairs WHERE prediction_json IS NOT NULL AND id IN"
            " (SELECT DISTINCT pair_id FROM runs WHERE lab = ?)"
            " ORDER BY created_at DESC, id LIMIT ?",
            (self.lab, limit),
        )
        return rows[::-1]

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
            f" WHERE p.owner = ? AND r.state IN ({_LIVE_IN})",
            (owner,),
        )
        return int(row["n"]) if row else 0

    def class_page(self, offset: int, limit: int) -> tuple[list[Row], int]:
        """One page of this lab's pairs for the class view, those with a queued or active
        run first, then newest first ({id, live}); and how many pairs there are in all."""
        page = self.db.run(
            f"SELECT p.id AS id, MAX(CASE WHEN r.state IN ({_LIVE_IN})"
            " THEN 1 ELSE 0 END) AS live, p.created_at AS created_at"
            " FROM pairs p JOIN runs r ON r.pair_id = p.id WHERE r.lab = ?"
            " GROUP BY p.id, p.created_at ORDER BY live DESC, p.created_at DESC, p.id"
            " LIMIT ? OFFSET ?",
            (self.lab, limit, offset),
        )
        row = self.db.one(
            "SELECT COUNT(DISTINCT pair_id) AS n FROM runs WHERE lab = ?", (self.lab,)
        )
        return page, int(row["n"]) if row else 0

    def student_numbers(self, owners: Sequence[str]) -> dict[str, int]:
        """Each owner's number in this lab's class: 1 for the browser whose first pair came
        first, 2 for the next, … (stable; the session id itself stays private)."""
        if not owners:
            return {}
        rows = self.db.run(
            "SELECT p.owner AS owner, MIN(p.created_at) AS first FROM pairs p"
            " WHERE p.id IN (SELECT DISTINCT pair_id FROM runs WHERE lab = ?)"
            " GROUP BY p.owner ORDER BY first, p.owner",
            (self.lab,),
        )
        wanted = set(owners)
        return {r["owner"]: i for i, r in enumerate(rows, 1) if r["owner"] in wanted}

    def runs_of_pairs(self, pair_ids: Sequence[str]) -> list[Row]:
        """The runs of these pairs (one statement per 500 pairs)."""
        rows: list[Row] = []
        for start in range(0, len(pair_ids), INSERT_BATCH):
            chunk = pair_ids[start : start + INSERT_BATCH]
            marks = ", ".join("?" for _ in chunk)
            rows += self.db.run(f"SELECT * FROM runs WHERE pair_id IN ({marks})", chunk)
        return rows

    def active_pairs_from(self, client: str) -> int:
        """Pairs created from the address `client` with a run queued or not ended."""
        row = self.db.one(
            "SELECT COUNT(DISTINCT p.id) AS n FROM pairs p JOIN runs r ON r.pair_id = p.id"
            f" WHERE p.client = ? AND r.state IN ({_LIVE_IN})",
            (client,),
        )
        return int(row["n"]) if row else 0

    def disk_bytes_from(self, client: str) -> int:
        """What the live pairs from the address `client` will write to disk, together."""
        row = self.db.one(
            "SELECT COALESCE(SUM(disk_bytes), 0) AS n FROM pairs WHERE client = ? AND id IN"
            f" (SELECT pair_id FROM runs WHERE state IN ({_LIVE_IN}))",
            (client,),
        )
        return int(row["n"]) if row else 0

    def ended_runs_with_checkpoints(self) -> list[Row]:
        """This lab's runs that have ended and whose checkpoints were not deleted yet,
        the oldest ended first."""
        return self.db.run(
            f"SELECT * FROM runs WHERE lab = ? AND state IN ({marks(TERMINAL_STATES)})"
            " AND ckpt_deleted_at IS NULL ORDER BY COALESCE(ended_at, 0), id",
            (self.lab, *TERMINAL_STATES),
        )

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
        self.db.run(f"UPDATE runs SET {_sets(fields)} WHERE id = ?", (*fields.values(), run_id))

    def update_run_if(self, run_id: str, expected: str, /, **fields: Any) -> bool:
        """`update_run` only while the run's state is `expected`; whether it was (one statement:
        the scheduler and a Stop click on another thread cannot both take a queued run)."""
        rows = self.db.run(
            f"UPDATE runs SET {_sets(fields)} WHERE id = ? AND state = ? RETURNING id",
            (*fields.values(), run_id, expected),
        )
        return bool(rows)

    # ---- records --------------------------------------------------------------------

    def insert_records(
        self, run_id: str, records: Sequence[NewRecord], new_offset: int, run_fields: dict[str, Any]
    ) -> list[tuple[int, NewRecord]]:
        """Insert records and move the ingest offset atomically.

        Records already present (same dedup key) are skipped: ingest is idempotent.
        Returns (id, record) of the rows inserted now, in id (= file) order.

        Against a remote Postgres each statement costs a network round trip: up to
        INSERT_BATCH records and the run's new offset go in one statement (a
        data-modifying WITH, atomic on its own); more, or on SQLite (which has no
        data-modifying WITH and pays no round trips), one multi-row INSERT per
        INSERT_BATCH records and the UPDATE in a transaction.
        """
        fields = {"ingest_offset": new_offset, **run_fields}
        if not records:
            self.update_run(run_id, **fields)
            return []
        if self.db.dialect == "postgres" and len(records) <= INSERT_BATCH:
            insert, params, first = _insert_records(run_id, records)
            rows = self.db.run(
                f"WITH ins AS ({insert}),"
                f" upd AS (UPDATE runs SET {_sets(fields)} WHERE id = ? RETURNING id)"
                " SELECT id, dedup_key FROM ins",
                [*params, *fields.values(), run_id],
            )
            return sorted((int(row["id"]), first[row["dedup_key"]]) for row in rows)
        inserted = []
        with self.db.transaction():
            for start in range(0, len(records), INSERT_BATCH):
                insert, params, first = _insert_records(
                    run_id, records[start : start + INSERT_BATCH]
                )
                rows = self.db.run(insert, params)
                inserted += sorted((int(row["id"]), first[row["dedup_key"]]) for row in rows)
            self.update_run(run_id, **fields)
        return inserted

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

    def restart_events(self, run_ids: Sequence[str]) -> list[Row]:
        """(run_id, data) of the supervisors' restart events of these runs (the event
        contract gives each one `resume_from`), one statement per 500 runs."""
        rows: list[Row] = []
        for start in range(0, len(run_ids), INSERT_BATCH):
            chunk = run_ids[start : start + INSERT_BATCH]
            marks = ", ".join("?" for _ in chunk)
            rows += self.db.run(
                f"SELECT run_id, data FROM records WHERE run_id IN ({marks}) AND kind = 'event'"
                " AND data LIKE '%\"resume_from\"%'",
                chunk,
            )
        return rows

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


def _sets(fields: dict[str, Any]) -> str:
    """`a = ?, b = ?` for run columns (a name that is not one is refused)."""
    return set_clause(fields, _RUN_COLUMNS, "run column")


def _insert_records(
    run_id: str, records: Sequence[NewRecord]
) -> tuple[str, list[Any], dict[str, NewRecord]]:
    """The INSERT of `records` (new rows only, their id and key returned), its
    parameters, and the record each key stands for (a key twice: the first one counts)."""
    first: dict[str, NewRecord] = {}
    for rec in records:
        first.setdefault(rec.dedup_key, rec)
    sql = (
        "INSERT INTO records (run_id, dedup_key, segment, kind, step, t, data)"
        f" VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?)'] * len(records))}"
        " ON CONFLICT (run_id, dedup_key) DO NOTHING RETURNING id, dedup_key"
    )
    params = [
        v for r in records for v in (run_id, r.dedup_key, r.segment, r.kind, r.step, r.t, r.data)
    ]
    return sql, params, first
