-- crashdrill schema, version 7: a run held by the lab while its student answers the
-- lesson's question (its trainer stopped where it is, workers/hold.py) says so in its row,
-- so that every view of the run, on any page, shows it held (JSON: {"at_step", "since",
-- "until"}; server/run_control.py writes it, server/views.py reads it).

ALTER TABLE runs ADD COLUMN held_json TEXT;
