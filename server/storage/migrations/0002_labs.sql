-- crashdrill schema, version 2: several labs may share one database (a Supabase
-- project's Postgres). Each server keeps its lab id in DATA_DIR/lab_id; it schedules,
-- adopts and resumes only the runs it started, and reads only its own machine's
-- telemetry. Rows from before this version get the id of the first server that starts.

ALTER TABLE runs ADD COLUMN lab TEXT;
ALTER TABLE telemetry ADD COLUMN lab TEXT;

CREATE INDEX runs_lab_state ON runs (lab, state, queued_at);
CREATE INDEX telemetry_lab ON telemetry (lab, id);
