-- The completer's read (docs/contract.md section 11.4,
-- idemdriver.AbandonedLister): abandoned executions are PROCESSING past
-- their lease (the partial index idem_keys_processing) or FAILED, and FAILED
-- records had no index (a read of them scanned idem_keys). This partial one
-- holds only them, keyed by created_at, which no update but a new life
-- changes: SQLite leaves it alone on every UPDATE that changes neither the
-- state nor created_at (a heartbeat's lease and updated_at).
--
-- A migration that rebuilds idem_keys (as 00007 does) must create this
-- index again with the others.

-- +goose Up
CREATE INDEX idem_keys_failed ON idem_keys (created_at) WHERE state = 'FAILED';

-- +goose Down
DROP INDEX idem_keys_failed;
