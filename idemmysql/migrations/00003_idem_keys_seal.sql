-- Sealing at rest (docs/sealing.md): seal_key names the key
-- (idem.EngineConfig.SealKeys) that sealed the record's response and
-- request, '' for a plain record, as every record written before this
-- migration is. When it is set, response_body holds the sealed headers and
-- body (package seal) and response_headers is NULL. A binary string like
-- scope and key, at most 64 bytes (idemdriver.MaxSealKeyBytes).
-- MariaDB 10.3+ and MySQL 8.0.12+ add a trailing column instantly.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_keys ADD COLUMN seal_key VARBINARY(64) NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN seal_key;
