-- fakepsp's charges, beside idem's idem_keys in the same schema (the
-- connection's search_path). Times come from the database's clock.

-- +goose Up
CREATE TABLE charges (
    id          text        NOT NULL PRIMARY KEY,
    merchant    text        COLLATE "C" NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    customer    text        NOT NULL,
    description text,
    created_at  timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX charges_merchant_currency ON charges (merchant, currency);

-- +goose Down
DROP TABLE charges;
