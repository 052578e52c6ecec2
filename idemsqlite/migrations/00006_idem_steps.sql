-- The steps of an execution (docs/contract.md section 11.1, idemdriver.Stepper):
-- one row per (scope, key, record life, name), the record life being the
-- record's created_at, so that a new life of a key sees none of an earlier
-- life's steps. A row is a start marker until done; relay and result are
-- opaque bytes (sealed under seal_key when sealing is on). The foreign key
-- (the driver turns foreign_keys on for every connection) removes a
-- record's steps with it (purge, release); a new life leaves the earlier
-- life's rows until then, unread.

-- +goose Up
CREATE TABLE idem_steps (
    scope         TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    name          TEXT    NOT NULL,
    started_token INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    relay         BLOB    NOT NULL,
    done          INTEGER NOT NULL DEFAULT 0,
    result        BLOB,
    finished_at   INTEGER,
    seal_key      TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (scope, key, created_at, name),
    FOREIGN KEY (scope, key) REFERENCES idem_keys (scope, key) ON DELETE CASCADE
);

-- +goose Down
DROP TABLE idem_steps;
