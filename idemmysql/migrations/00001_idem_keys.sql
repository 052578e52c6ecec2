-- The execution record of CONTRACT section 9, for MySQL 8.0+ and MariaDB 10.6+.
--
-- Times are DATETIME(6): microseconds, no time zone attached, always written
-- from UTC_TIMESTAMP(6), so the session's time_zone cannot shift them.
-- Scope, key, method, path and fingerprint are binary strings: they compare
-- byte by byte (keys are case-sensitive; trailing spaces count, no PAD SPACE)
-- and are stored exactly as sent, whatever the connection's character set.
-- The primary key is 2 x 255 bytes, well inside InnoDB's 3072-byte index limit.
-- Response bodies are LONGBLOB, byte-exact; in practice a row is bounded by the
-- server's max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL 8).
--
-- One statement per migration: MySQL commits every DDL statement on its own,
-- so a version with several statements can fail half-applied. IF NOT EXISTS:
-- a process killed after this CREATE TABLE committed and before goose
-- recorded version 1 leaves the table without its version; the next Migrate
-- then finds the table and records the version instead of failing "Table
-- 'idem_keys' already exists" on every start (TestMigrateAfterKillBeforeVersionRecorded).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS idem_keys (
    scope                VARBINARY(255) NOT NULL,
    `key`                VARBINARY(255) NOT NULL,
    method               VARBINARY(255) NOT NULL,
    path                 BLOB           NOT NULL,
    fingerprint          BLOB           NOT NULL,
    state                VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fencing_token        BIGINT         NOT NULL,
    locked_until         DATETIME(6)    NULL,
    response_status      INT            NULL,
    response_headers     MEDIUMBLOB     NULL,
    response_body        LONGBLOB       NULL,
    response_body_stored BOOLEAN        NULL,
    response_body_size   BIGINT         NULL,
    created_at           DATETIME(6)    NOT NULL,
    updated_at           DATETIME(6)    NOT NULL,
    completed_at         DATETIME(6)    NULL,
    expires_at           DATETIME(6)    NOT NULL,
    attempts             INT            NOT NULL,
    PRIMARY KEY (scope, `key`),
    INDEX idem_keys_expires_at (expires_at),
    INDEX idem_keys_processing (state, locked_until),
    CONSTRAINT idem_keys_state CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED'))
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE idem_keys;
