-- The execution record of CONTRACT section 9. Every time comes from the
-- database's clock. Keys and scopes compare byte-wise (COLLATE "C"): keys are
-- case-sensitive. Response bodies are bytea, not jsonb: replay is byte-exact.

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
    PRIMARY KEY (scope, key)
);
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
CREATE INDEX idem_keys_processing ON idem_keys (locked_until) WHERE state = 'PROCESSING';

-- +goose Down
DROP TABLE idem_keys;
