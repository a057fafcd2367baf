-- crashdrill schema, version 6: a kill the lab signalled (a crash test, armed until it lands
-- for a crash mode that waits for a save, or a preemption) is kept in the run's row until
-- its restart writes a step record, so that the run view says so and a server restart that
-- adopts the trainer still knows it (JSON: {"kind", "mode", "armed", "at_step", "segment"};
-- server/pending_kill.py reads it).

ALTER TABLE runs ADD COLUMN pending_kill_json TEXT;
