-- The steps of an execution (docs/contract.md section 11.1, idemdriver.Stepper):
-- one row per (scope, key, record life, name), the record life being the
-- record's created_at, so that a new life of a key sees none of an earlier
-- life's steps. A row is a start marker until done; relay and result are
-- opaque to the database (sealed under seal_key when sealing is on). The
-- foreign key removes a record's steps with it (purge, release); a new life
-- leaves the earlier life's rows until then, unread.

-- +goose Up
CREATE TABLE idem_steps (
    scope         text        COLLATE "C" NOT NULL,
    key           text        COLLATE "C" NOT NULL,
    created_at    timestamptz NOT NULL,
    name          text        COLLATE "C" NOT NULL,
    started_token bigint      NOT NULL,
    started_at    timestamptz NOT NULL,
    relay         bytea       NOT NULL,
    done          boolean     NOT NULL DEFAULT false,
    result        bytea,
    finished_at   timestamptz,
    seal_key      text        NOT NULL DEFAULT '',
    PRIMARY KEY (scope, key, created_at, name),
    FOREIGN KEY (scope, key) REFERENCES idem_keys (scope, key) ON DELETE CASCADE
);

-- +goose Down
DROP TABLE idem_steps;
