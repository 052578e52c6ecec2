-- The wait mode's mark (docs/contract.md "Waiting for the owner"): a
-- duplicate in another process that waits for this record's execution sets
-- waited (Driver.MarkWaited, never waiting for the row's lock), and a
-- durable-claim completion, release or failure sends its NOTIFY only when
-- it is set, so that first executions pay nothing for the wait mode while
-- nobody waits. Never cleared: once a key was waited for, every later end of
-- its record notifies. A constant default: PostgreSQL 11+ adds the column
-- without rewriting the table.

-- +goose Up
ALTER TABLE idem_keys ADD COLUMN waited boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE idem_keys DROP COLUMN waited;
