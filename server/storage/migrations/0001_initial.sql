-- crashdrill schema, version 1. Plain SQL that SQLite and Postgres both accept, except
-- the id columns: a line starting with "-- sqlite:" or "-- postgres:" is SQL for that
-- dialect only (server/db.py, split_sql).

CREATE TABLE pairs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    preset TEXT NOT NULL,
    preset_json TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    pair_id TEXT NOT NULL REFERENCES pairs (id),
    label TEXT NOT NULL,
    preset TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    queued_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION,
    pid INTEGER,
    pid_started DOUBLE PRECISION,
    exit_code INTEGER,
    stage TEXT,
    stage_progress DOUBLE PRECISION,
    step BIGINT,
    segment BIGINT NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    ingest_offset BIGINT NOT NULL DEFAULT 0,
    latest_json TEXT NOT NULL DEFAULT '{}',
    message TEXT
);

CREATE INDEX runs_pair ON runs (pair_id);
CREATE INDEX runs_state ON runs (state, queued_at);

-- One row per line of a run's records.jsonl. dedup_key makes ingest idempotent:
-- "segment:step:kind" for step-bearing kinds, "@byte_offset" for the others.
CREATE TABLE records (
    -- sqlite: id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- postgres: id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id),
    dedup_key TEXT NOT NULL,
    segment BIGINT NOT NULL,
    kind TEXT NOT NULL,
    step BIGINT,
    t DOUBLE PRECISION,
    data TEXT NOT NULL,
    UNIQUE (run_id, dedup_key)
);

CREATE INDEX records_run_kind ON records (run_id, kind, id);

CREATE TABLE telemetry (
    -- sqlite: id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- postgres: id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    t DOUBLE PRECISION NOT NULL,
    data TEXT NOT NULL
);
