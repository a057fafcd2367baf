-- crashdrill schema, version 5: predict, then crash (issue #23). A pair keeps its owner's
-- prediction (JSON: {"answers": {"A": 40, "B": 150} or null when skipped, "at": time}) and,
-- once every predicted run's first restart is in, the measured outcome (JSON by run).

ALTER TABLE pairs ADD COLUMN prediction_json TEXT;
ALTER TABLE pairs ADD COLUMN outcome_json TEXT;
