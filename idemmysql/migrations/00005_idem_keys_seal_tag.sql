-- The seal tag (docs/sealing.md): under the record's seal_key, it
-- authenticates the plain response columns (status, body-stored flag, body
-- size) and whether the sealed blob is kept, bound to the record's life, so
-- an emptied or edited sealed record does not open. A small column apart
-- from the blob: a completion past max_allowed_packet drops the blob and
-- keeps a tag that says so. NULL for a plain record and for every record
-- sealed before this migration (they open by their blob alone). At most 64
-- bytes (idemdriver.MaxSealTagBytes). One statement per migration (see
-- 00001).

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_keys ADD COLUMN seal_tag VARBINARY(64) NULL;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN seal_tag;
