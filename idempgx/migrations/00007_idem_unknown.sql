-- The UNKNOWN state (docs/contract.md section 11.3): an at-most-once step
-- started and its outcome cannot be known. idem_keys's state may now be
-- UNKNOWN; such a record holds no lease and expires in the far future
-- (9999-12-31), so no claim, purge or partition drop of this version or an
-- earlier one touches it. The new CHECK is added NOT VALID: it allows more
-- than the one it replaces, so every existing row satisfies it, and
-- validating it would scan the table under this migration's ACCESS
-- EXCLUSIVE lock for nothing; PostgreSQL checks it on every write all the
-- same.
--
-- idem_steps keeps whether a step is at-most-once (its start is never
-- started again), why its record became UNKNOWN, and who resolved it, when
-- and why (`idem resolve`, idemdriver.Stepper.ResolveStep).

-- +goose Up
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_state_check,
    ADD CONSTRAINT idem_keys_state_check CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')) NOT VALID;
ALTER TABLE idem_steps
    ADD COLUMN at_most_once boolean     NOT NULL DEFAULT false,
    ADD COLUMN reason       text        COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN resolved_by  text        NOT NULL DEFAULT '',
    ADD COLUMN resolved_why text        NOT NULL DEFAULT '',
    ADD COLUMN resolved_at  timestamptz;

-- +goose Down
-- An UNKNOWN record would break the earlier CHECK: it is refused, and the
-- migration with it, until every such record is resolved (idem resolve).
ALTER TABLE idem_steps
    DROP COLUMN at_most_once,
    DROP COLUMN reason,
    DROP COLUMN resolved_by,
    DROP COLUMN resolved_why,
    DROP COLUMN resolved_at;
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_state_check,
    ADD CONSTRAINT idem_keys_state_check CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED'));
