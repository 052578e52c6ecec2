-- fakepsp's charges, beside idem's idem_keys in the same file. Times are
-- integer microseconds since the Unix epoch, UTC, from SQLite's clock.

-- +goose Up
CREATE TABLE charges (
    id          TEXT    NOT NULL PRIMARY KEY,
    merchant    TEXT    NOT NULL,
    amount      INTEGER NOT NULL CHECK (amount > 0),
    currency    TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    customer    TEXT    NOT NULL,
    description TEXT,
    created_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX charges_merchant_currency ON charges (merchant, currency);

-- +goose Down
DROP TABLE charges;
