-- The completer's read (docs/contract.md section 11.4,
-- idemdriver.AbandonedLister): abandoned executions are PROCESSING past
-- their lease (the partial index idem_keys_processing) or FAILED, and FAILED
-- records had no index. This partial one holds only them, keyed by
-- created_at, which no update but a new life changes, so the updates that
-- do not change the state stay HOT as before.
--
-- Built CONCURRENTLY, outside a transaction: claims and completions go on
-- while it is built. If it is interrupted, PostgreSQL leaves an invalid
-- index behind: DROP INDEX idem_keys_failed, then migrate again.

-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY idem_keys_failed ON idem_keys (created_at) WHERE state = 'FAILED';

-- +goose Down
DROP INDEX CONCURRENTLY idem_keys_failed;
