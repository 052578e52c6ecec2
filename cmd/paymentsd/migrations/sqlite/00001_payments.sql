-- The demo's business tables, beside idem's idem_keys in the same file.
-- Times are integer microseconds since the Unix epoch, UTC, from SQLite's clock.

-- +goose Up
CREATE TABLE payments (
    id                 TEXT    NOT NULL PRIMARY KEY,
    merchant           TEXT    NOT NULL,
    amount             INTEGER NOT NULL CHECK (amount > 0),
    currency           TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    customer           TEXT    NOT NULL,
    description        TEXT,
    status             TEXT    NOT NULL,
    provider_charge_id TEXT    NOT NULL UNIQUE,
    created_at         INTEGER NOT NULL
) STRICT;
CREATE INDEX payments_merchant_created_at ON payments (merchant, created_at, id);

CREATE TABLE ledger_entries (
    id         TEXT    NOT NULL PRIMARY KEY,
    payment_id TEXT    NOT NULL REFERENCES payments (id),
    merchant   TEXT    NOT NULL,
    amount     INTEGER NOT NULL,
    currency   TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX ledger_entries_merchant_currency ON ledger_entries (merchant, currency);
CREATE INDEX ledger_entries_payment_id ON ledger_entries (payment_id);

-- +goose Down
DROP TABLE ledger_entries;
DROP TABLE payments;
