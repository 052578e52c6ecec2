-- The demo's business tables, beside idem's idem_keys in the same schema
-- (the connection's search_path). Times come from the database's clock.

-- +goose Up
CREATE TABLE payments (
    id                 text        NOT NULL PRIMARY KEY,
    merchant           text        COLLATE "C" NOT NULL,
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    customer           text        NOT NULL,
    description        text,
    status             text        NOT NULL,
    provider_charge_id text        NOT NULL UNIQUE,
    created_at         timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX payments_merchant_created_at ON payments (merchant, created_at, id);

CREATE TABLE ledger_entries (
    id         text        NOT NULL PRIMARY KEY,
    payment_id text        NOT NULL REFERENCES payments (id),
    merchant   text        COLLATE "C" NOT NULL,
    amount     bigint      NOT NULL,
    currency   text        NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX ledger_entries_merchant_currency ON ledger_entries (merchant, currency);
CREATE INDEX ledger_entries_payment_id ON ledger_entries (payment_id);

-- +goose Down
DROP TABLE ledger_entries;
DROP TABLE payments;
