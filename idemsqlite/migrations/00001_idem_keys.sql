-- The execution record of CONTRACT section 9. Times are integer microseconds
-- since the Unix epoch, UTC, read from SQLite's clock.

-- +goose Up
CREATE TABLE idem_keys (
    scope                TEXT    NOT NULL,
    key                  TEXT    NOT NULL,
    method               TEXT    NOT NULL,
    path                 TEXT    NOT NULL,
    fingerprint          BLOB    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED')),
    fencing_token        INTEGER NOT NULL,
    locked_until         INTEGER,
    response_status      INTEGER,
    response_headers     BLOB,
    response_body        BLOB,
    response_body_stored INTEGER,
    response_body_size   INTEGER,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    completed_at         INTEGER,
    expires_at           INTEGER NOT NULL,
    attempts             INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
CREATE INDEX idem_keys_processing ON idem_keys (locked_until) WHERE state = 'PROCESSING';

-- +goose Down
DROP TABLE idem_keys;
