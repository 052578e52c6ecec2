-- Sealing at rest and the kept request (docs/sealing.md).
-- seal_key names the key (idem.EngineConfig.SealKeys) that sealed the
-- record's response and request: '' for a plain record, as every record
-- written before this migration is. When it is set, response_body holds the
-- sealed headers and body (package seal) and response_headers is NULL.
-- request is the request kept for an audit (EngineConfig.KeepRequestBytes),
-- sealed like the response; NULL when none was kept.
-- Added on the partitioned table, the columns reach every partition; the
-- partitions created later (CREATE TABLE ... LIKE idem_keys) have them too.

-- +goose Up
ALTER TABLE idem_keys ADD COLUMN seal_key text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN request bytea;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN seal_key, DROP COLUMN request;
