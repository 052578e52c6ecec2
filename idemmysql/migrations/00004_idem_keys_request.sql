-- The request kept for an audit (idem.EngineConfig.KeepRequestBytes),
-- sealed like the response when sealing is on; NULL when none was kept.
-- LONGBLOB like response_body. One statement per migration (see 00001).

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_keys ADD COLUMN request LONGBLOB NULL;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN request;
