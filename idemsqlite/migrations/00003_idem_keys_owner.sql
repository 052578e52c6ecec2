-- Who claimed each record (idemdriver.ClaimParams.Owner: "host/pid" or a
-- configured instance name), written by every claim, so that `idem stuck`
-- can say whose worker died. Records claimed before this migration have ''.

-- +goose Up
ALTER TABLE idem_keys ADD COLUMN owner TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN owner;
