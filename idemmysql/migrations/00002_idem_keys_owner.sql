-- Who claimed each record (idemdriver.ClaimParams.Owner: "host/pid" or a
-- configured instance name), written by every claim, so that `idem stuck`
-- can say whose worker died. Records claimed before this migration have ''.
-- A binary string like scope and key, at most 255 bytes (MaxOwnerBytes).
-- MariaDB 10.3+ and MySQL 8.0.12+ add a trailing column instantly.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_keys ADD COLUMN owner VARBINARY(255) NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN owner;
