-- crashdrill schema, version 4 (issue #24): a run that failed keeps its trainer's error output (a
-- traceback, the server's paths) for the instructor's class view and nobody else; the
-- run's `message`, which every viewer sees, says only how it ended (issue #24).

ALTER TABLE runs ADD COLUMN detail TEXT;

-- A pair keeps what its two runs will write to disk (checkpoints × size, mirror copies
-- counted; server/lesson_bounds.py), so that a client address's live pairs are bounded in
-- bytes as well as in number (max_disk_bytes_per_address, server/quotas.py).
ALTER TABLE pairs ADD COLUMN disk_bytes BIGINT;
