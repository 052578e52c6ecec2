-- The UNKNOWN state (docs/contract.md section 11.3) and the completer's read
-- of FAILED records (section 11.4) on the partitioned table.
--
-- An UNKNOWN record's expires_at is the far future (9999-12-31): the
-- partition idem_keys_unknown holds every row from 9999-01-01 on. Its name
-- does not start with idem_keys_p, so no partition drop of this version or
-- an earlier one touches it; marking a record UNKNOWN moves its row there,
-- and resolving it moves the row back to the partition of its new
-- expires_at. Created as the daily partitions are (LIKE, then ATTACH, which
-- takes SHARE UPDATE EXCLUSIVE on idem_keys: claims go on).
--
-- The state's CHECK is replaced NOT VALID, as on the plain table: it allows
-- more than the one it replaces, and it reaches every partition.
--
-- idem_keys_failed is created ON ONLY the partitioned table, which is
-- instant and builds nothing: every partition attached later gets its own
-- index at ATTACH (empty then), and EnsurePartitions, which Migrate runs
-- next, builds the existing partitions' indexes CONCURRENTLY and attaches
-- them (docs/retention.md).

-- +goose Up
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_state_check,
    ADD CONSTRAINT idem_keys_state_check CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')) NOT VALID;
CREATE INDEX idem_keys_failed ON ONLY idem_keys (created_at) WHERE state = 'FAILED';
CREATE TABLE idem_keys_unknown (LIKE idem_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE idem_keys ATTACH PARTITION idem_keys_unknown FOR VALUES FROM ('9999-01-01 00:00:00+00') TO (MAXVALUE);

-- +goose Down
-- The earlier CHECK is added first, validated: an UNKNOWN record breaks it,
-- so the migration is refused until every such record is resolved (idem
-- resolve), and the far-future partition is empty when it is dropped.
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_state_check,
    ADD CONSTRAINT idem_keys_state_check CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED'));
ALTER TABLE idem_keys DETACH PARTITION idem_keys_unknown;
DROP TABLE idem_keys_unknown;
DROP INDEX idem_keys_failed;
