-- The steps of an execution (docs/contract.md section 11.1, idemdriver.Stepper):
-- one row per (scope, key, record life, name), the record life being the
-- record's created_at, so that a new life of a key sees none of an earlier
-- life's steps. A row is a start marker until done; relay and result are
-- opaque bytes (sealed under seal_key when sealing is on). The foreign key
-- removes a record's steps with it (purge, release); a new life leaves the
-- earlier life's rows until then, unread. One statement, IF NOT EXISTS (see
-- 00001).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS idem_steps (
    scope         VARBINARY(255) NOT NULL,
    `key`         VARBINARY(255) NOT NULL,
    created_at    DATETIME(6)    NOT NULL,
    name          VARBINARY(128) NOT NULL,
    started_token BIGINT         NOT NULL,
    started_at    DATETIME(6)    NOT NULL,
    relay         BLOB           NOT NULL,
    done          BOOLEAN        NOT NULL DEFAULT FALSE,
    result        LONGBLOB       NULL,
    finished_at   DATETIME(6)    NULL,
    seal_key      VARBINARY(64)  NOT NULL DEFAULT '',
    PRIMARY KEY (scope, `key`, created_at, name),
    CONSTRAINT idem_steps_record FOREIGN KEY (scope, `key`) REFERENCES idem_keys (scope, `key`) ON DELETE CASCADE
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE idem_steps;
