-- The steps of an execution (docs/contract.md section 11.1,
-- idemdriver.Stepper), as on the plain table: one row per (scope, key,
-- record life, name), the record life being the record's created_at. The
-- columns are those of the plain set's 00006 and 00007 together.
--
-- No foreign key: PostgreSQL cannot reference a table partitioned by time
-- on (scope, key), and a partition is dropped whole. A statement that
-- deletes a record (release, remove, purge) deletes its life's steps in the
-- same statement; the steps of a dropped partition's records and of earlier
-- lives are swept by DropPartitions, oldest first through
-- idem_steps_started_at (see docs/retention.md).

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
    at_most_once  boolean     NOT NULL DEFAULT false,
    reason        text        COLLATE "C" NOT NULL DEFAULT '',
    resolved_by   text        NOT NULL DEFAULT '',
    resolved_why  text        NOT NULL DEFAULT '',
    resolved_at   timestamptz,
    PRIMARY KEY (scope, key, created_at, name)
);
CREATE INDEX idem_steps_started_at ON idem_steps (started_at);

-- +goose Down
DROP TABLE idem_steps;
