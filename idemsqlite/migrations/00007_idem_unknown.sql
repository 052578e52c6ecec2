-- The UNKNOWN state (docs/contract.md section 11.3): an at-most-once step
-- started and its outcome cannot be known. idem_keys's state may now be
-- UNKNOWN; such a record holds no lease and expires in the far future
-- (9999-12-31), so no claim or purge of this version or an earlier one
-- touches it. idem_steps keeps whether a step is at-most-once (its start is
-- never started again), why its record became UNKNOWN, and who resolved it,
-- when and why (`idem resolve`, idemdriver.Stepper.ResolveStep);
-- resolved_at is microseconds since the Unix epoch, NULL until resolved.
--
-- SQLite cannot alter a CHECK constraint: both tables are rebuilt, in this
-- migration's one transaction, every row kept (rowids too). The connections
-- run with foreign_keys on, which cannot change inside a transaction, and
-- idem_steps's foreign key cascades the DROP of a record's table into its
-- steps; so the old tables are renamed aside (idem_steps first: renaming
-- idem_keys then points its foreign key at the old idem_keys), the new ones
-- created under the old names, the rows copied, the old tables dropped,
-- idem_steps before idem_keys, and idem_keys's indexes created again. A step
-- whose record is gone (only a connection without foreign keys leaves one)
-- is the one the cascade would have removed: it is not copied.
--
-- A view, a trigger or another table's foreign key naming idem_keys or
-- idem_steps would be carried off with the old table (a cascade would delete
-- its rows): the migration refuses to run then, and writes nothing. Drop
-- it, migrate, and create it again. The other tables (the maintenance lock,
-- the migration lease, the version table, the application's) are not
-- touched.

-- +goose Up
CREATE TEMP TABLE idem_00007_guard (
    refs INTEGER CONSTRAINT "a view, trigger or foreign key names idem_keys or idem_steps: drop it, migrate, create it again (00007_idem_unknown.sql)" CHECK (refs = 0)
);
INSERT INTO temp.idem_00007_guard (refs)
SELECT (SELECT count(*) FROM main.sqlite_schema AS t, pragma_foreign_key_list(t.name) AS f
        WHERE t.type = 'table' AND t.name <> 'idem_steps' AND lower(f."table") IN ('idem_keys', 'idem_steps'))
     + (SELECT count(*) FROM main.sqlite_schema WHERE type IN ('view', 'trigger')
        AND (instr(lower(sql), 'idem_keys') > 0 OR instr(lower(sql), 'idem_steps') > 0));
DROP TABLE temp.idem_00007_guard;

ALTER TABLE idem_steps RENAME TO idem_steps_v6;
ALTER TABLE idem_keys RENAME TO idem_keys_v6;

CREATE TABLE idem_keys (
    scope                TEXT    NOT NULL,
    key                  TEXT    NOT NULL,
    method               TEXT    NOT NULL,
    path                 TEXT    NOT NULL,
    fingerprint          BLOB    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
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
    owner                TEXT    NOT NULL DEFAULT '',
    seal_key             TEXT    NOT NULL DEFAULT '',
    request              BLOB,
    seal_tag             BLOB,
    PRIMARY KEY (scope, key)
);
INSERT INTO idem_keys (rowid, scope, key, method, path, fingerprint, state, fencing_token, locked_until,
    response_status, response_headers, response_body, response_body_stored, response_body_size,
    created_at, updated_at, completed_at, expires_at, attempts, owner, seal_key, request, seal_tag)
SELECT rowid, scope, key, method, path, fingerprint, state, fencing_token, locked_until,
    response_status, response_headers, response_body, response_body_stored, response_body_size,
    created_at, updated_at, completed_at, expires_at, attempts, owner, seal_key, request, seal_tag
FROM idem_keys_v6;

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
    at_most_once  INTEGER NOT NULL DEFAULT 0,
    reason        TEXT    NOT NULL DEFAULT '',
    resolved_by   TEXT    NOT NULL DEFAULT '',
    resolved_why  TEXT    NOT NULL DEFAULT '',
    resolved_at   INTEGER,
    PRIMARY KEY (scope, key, created_at, name),
    FOREIGN KEY (scope, key) REFERENCES idem_keys (scope, key) ON DELETE CASCADE
);
INSERT INTO idem_steps (rowid, scope, key, created_at, name, started_token, started_at, relay, done, result,
    finished_at, seal_key)
SELECT s.rowid, s.scope, s.key, s.created_at, s.name, s.started_token, s.started_at, s.relay, s.done, s.result,
    s.finished_at, s.seal_key
FROM idem_steps_v6 AS s
WHERE EXISTS (SELECT 1 FROM idem_keys AS k WHERE k.scope = s.scope AND k.key = s.key);

DROP TABLE idem_steps_v6;
DROP TABLE idem_keys_v6;
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
CREATE INDEX idem_keys_processing ON idem_keys (locked_until) WHERE state = 'PROCESSING';

-- +goose Down
-- The same rebuild, back to version 6's tables. An UNKNOWN record would
-- break the earlier CHECK: the migration is refused, and writes nothing,
-- until every such record is resolved (idem resolve); none is converted,
-- since an earlier version would run its at-most-once step again. The
-- steps lose what version 6 does not keep (at-most-once, the reason, the
-- resolution).
CREATE TEMP TABLE idem_00007_guard (
    refs    INTEGER CONSTRAINT "a view, trigger or foreign key names idem_keys or idem_steps: drop it, migrate, create it again (00007_idem_unknown.sql)" CHECK (refs = 0),
    unknown INTEGER CONSTRAINT "an UNKNOWN record remains: resolve it (idem resolve) before migrating down" CHECK (unknown = 0)
);
INSERT INTO temp.idem_00007_guard (refs, unknown)
SELECT (SELECT count(*) FROM main.sqlite_schema AS t, pragma_foreign_key_list(t.name) AS f
        WHERE t.type = 'table' AND t.name <> 'idem_steps' AND lower(f."table") IN ('idem_keys', 'idem_steps'))
     + (SELECT count(*) FROM main.sqlite_schema WHERE type IN ('view', 'trigger')
        AND (instr(lower(sql), 'idem_keys') > 0 OR instr(lower(sql), 'idem_steps') > 0)),
       (SELECT count(*) FROM idem_keys WHERE state = 'UNKNOWN');
DROP TABLE temp.idem_00007_guard;

ALTER TABLE idem_steps RENAME TO idem_steps_v7;
ALTER TABLE idem_keys RENAME TO idem_keys_v7;

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
    owner                TEXT    NOT NULL DEFAULT '',
    seal_key             TEXT    NOT NULL DEFAULT '',
    request              BLOB,
    seal_tag             BLOB,
    PRIMARY KEY (scope, key)
);
INSERT INTO idem_keys (rowid, scope, key, method, path, fingerprint, state, fencing_token, locked_until,
    response_status, response_headers, response_body, response_body_stored, response_body_size,
    created_at, updated_at, completed_at, expires_at, attempts, owner, seal_key, request, seal_tag)
SELECT rowid, scope, key, method, path, fingerprint, state, fencing_token, locked_until,
    response_status, response_headers, response_body, response_body_stored, response_body_size,
    created_at, updated_at, completed_at, expires_at, attempts, owner, seal_key, request, seal_tag
FROM idem_keys_v7;

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
INSERT INTO idem_steps (rowid, scope, key, created_at, name, started_token, started_at, relay, done, result,
    finished_at, seal_key)
SELECT s.rowid, s.scope, s.key, s.created_at, s.name, s.started_token, s.started_at, s.relay, s.done, s.result,
    s.finished_at, s.seal_key
FROM idem_steps_v7 AS s
WHERE EXISTS (SELECT 1 FROM idem_keys AS k WHERE k.scope = s.scope AND k.key = s.key);

DROP TABLE idem_steps_v7;
DROP TABLE idem_keys_v7;
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
CREATE INDEX idem_keys_processing ON idem_keys (locked_until) WHERE state = 'PROCESSING';
