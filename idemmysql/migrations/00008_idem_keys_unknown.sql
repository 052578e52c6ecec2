-- The UNKNOWN state (docs/contract.md section 11.3): a record whose
-- at-most-once step started and whose outcome cannot be known. It is never
-- claimed, taken over or purged (locked_until NULL, expires_at 9999-12-31)
-- until ResolveStep ends it FAILED. The CHECK constraint of 00001 knew
-- three states; this one allows 'UNKNOWN' too (7 bytes: state's
-- VARCHAR(10) holds it).
--
-- One statement (see 00001): the constraint is dropped and added again in
-- one ALTER TABLE, so no moment and no failure leaves idem_keys without
-- it, and a process killed after it committed and before goose recorded
-- version 8 runs it again unharmed (embeddedPresent records it instead,
-- having found 'UNKNOWN' in the constraint). DROP CONSTRAINT needs MariaDB
-- 10.2+ or MySQL 8.0.19+.
--
-- Adding a CHECK constraint checks every row: MySQL and MariaDB copy
-- idem_keys (ALGORITHM=COPY, no INPLACE or INSTANT for it), and writes to
-- the table wait until the copy ends; on Galera the ALTER runs on every
-- node at once (TOI) and the whole cluster waits. Migrate runs it once,
-- under its lease, whichever node it is on. Apply it in a quiet hour on a
-- large table. Before this migration is applied, MarkUnknown fails the
-- constraint and returns an error wrapping idemdriver.ErrSchemaTooOld,
-- writing nothing.
--
-- Down restores the three states: it fails (the CHECK constraint fails,
-- 4025 on MariaDB, 3819 on MySQL) and changes nothing while any record is
-- UNKNOWN. Resolve those first (`idem resolve`).

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_keys
    DROP CONSTRAINT idem_keys_state,
    ADD CONSTRAINT idem_keys_state CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'UNKNOWN'));

-- +goose Down
ALTER TABLE idem_keys
    DROP CONSTRAINT idem_keys_state,
    ADD CONSTRAINT idem_keys_state CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED'));
