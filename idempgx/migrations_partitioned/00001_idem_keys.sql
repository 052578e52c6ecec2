-- The execution record of CONTRACT section 9, range partitioned by expires_at
-- (one partition per UTC day, named idem_keys_pYYYYMMDD, created ahead and
-- dropped once every row in it has expired: see docs/retention.md). The
-- columns are those of the plain table. PostgreSQL requires the partition key
-- in every unique index, so the primary key is (scope, key, expires_at) and
-- does not by itself keep one record per (scope, key): the claim does, under
-- a transaction-scoped advisory lock on (scope, key).

-- +goose Up
CREATE TABLE idem_keys (
    scope                text        COLLATE "C" NOT NULL,
    key                  text        COLLATE "C" NOT NULL,
    method               text        NOT NULL,
    path                 text        NOT NULL,
    fingerprint          bytea       NOT NULL,
    state                text        NOT NULL CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED')),
    fencing_token        bigint      NOT NULL,
    locked_until         timestamptz,
    response_status      integer,
    response_headers     bytea,
    response_body        bytea,
    response_body_stored boolean,
    response_body_size   bigint,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    completed_at         timestamptz,
    expires_at           timestamptz NOT NULL,
    attempts             integer     NOT NULL,
    PRIMARY KEY (scope, key, expires_at)
) PARTITION BY RANGE (expires_at);
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
CREATE INDEX idem_keys_processing ON idem_keys (locked_until) WHERE state = 'PROCESSING';

-- +goose Down
DROP TABLE idem_keys;
