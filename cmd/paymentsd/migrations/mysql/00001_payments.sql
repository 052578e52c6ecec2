-- The demo's payments table, beside idem's idem_keys in the same database.
-- Times are DATETIME(6) in UTC, from the database's clock (UTC_TIMESTAMP(6)).
-- Merchants compare byte by byte (VARBINARY), as COLLATE "C" does on
-- PostgreSQL. One statement per migration: MySQL commits each DDL statement
-- on its own, so a version with several could fail half-applied.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE payments (
    id                 VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    merchant           VARBINARY(64)  NOT NULL,
    amount             BIGINT         NOT NULL,
    currency           CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    customer           VARCHAR(255)   NOT NULL,
    description        VARCHAR(1000)  NULL,
    status             VARCHAR(32)    NOT NULL,
    provider_charge_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at         DATETIME(6)    NOT NULL,
    UNIQUE KEY payments_provider_charge_id (provider_charge_id),
    INDEX payments_merchant_created_at (merchant, created_at, id),
    CONSTRAINT payments_amount CHECK (amount > 0),
    CONSTRAINT payments_currency CHECK (currency REGEXP '^[A-Z]{3}$')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE payments;
