-- The seal tag (docs/sealing.md): under the record's seal_key, it
-- authenticates the plain response columns (status, body-stored flag, body
-- size) and whether the sealed blob is kept, bound to the record's life, so
-- an emptied or edited sealed record does not open. A column of its own,
-- apart from the blob. NULL for a plain record and for every record sealed
-- before this migration (they open by their blob alone).

-- +goose Up
ALTER TABLE idem_keys ADD COLUMN seal_tag BLOB;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN seal_tag;
