-- The ledger: one entry per payment.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE ledger_entries (
    id         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    payment_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    merchant   VARBINARY(64) NOT NULL,
    amount     BIGINT        NOT NULL,
    currency   CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at DATETIME(6)   NOT NULL,
    INDEX ledger_entries_merchant_currency (merchant, currency),
    CONSTRAINT ledger_entries_payment FOREIGN KEY (payment_id) REFERENCES payments (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE ledger_entries;
