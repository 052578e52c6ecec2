-- Sealing at rest and the kept request (docs/sealing.md).
-- seal_key names the key (idem.EngineConfig.SealKeys) that sealed the
-- record's response and request: '' for a plain record, as every record
-- written before this migration is. When it is set, response_body holds the
-- sealed headers and body (package seal) and response_headers is NULL.
-- request is the request kept for an audit (EngineConfig.KeepRequestBytes),
-- sealed like the response; NULL when none was kept.

-- +goose Up
ALTER TABLE idem_keys ADD COLUMN seal_key TEXT NOT NULL DEFAULT '';
ALTER TABLE idem_keys ADD COLUMN request BLOB;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN request;
ALTER TABLE idem_keys DROP COLUMN seal_key;
