-- crashdrill schema, version 3: a lab that a class shares (issue #15). A pair keeps the
-- client address that created it, so that live pairs are counted per address as well as
-- per browser cookie; a run keeps when the lab deleted its checkpoints (its records stay).

ALTER TABLE pairs ADD COLUMN client TEXT;
ALTER TABLE runs ADD COLUMN ckpt_deleted_at DOUBLE PRECISION;

CREATE INDEX pairs_client ON pairs (client);
