-- The at-most-once steps and the UNKNOWN state (docs/contract.md section
-- 11.3, idemdriver.Stepper): at_most_once is the last start's
-- StartStepParams.AtMostOnce (such a start without a result is never
-- started again); reason says why the record became UNKNOWN at this step
-- (MarkUnknown, at most 64 bytes); resolved_by, resolved_why and
-- resolved_at keep who ended it, why and when (ResolveStep: an operator's
-- `idem resolve`, a reconcile function; at most 200 bytes each, refused
-- longer with ErrTooLong before any write). Rows written before this
-- migration are ordinary steps, never UNKNOWN nor resolved: FALSE, '' and
-- NULL. Binary strings like the table's other text columns.
--
-- One statement per migration (see 00001), which adds the five columns at
-- once, or none. MariaDB 10.3+ and MySQL 8.0.12+ add trailing columns
-- instantly. A process killed after it committed and before goose recorded
-- version 7 leaves the columns without their version: the next Migrate
-- finds at_most_once and records the version (embeddedPresent).
--
-- Until this migration is applied, every step statement of this version
-- fails "Unknown column" (1054) and returns an error wrapping
-- idemdriver.ErrSchemaTooOld, so a handler that uses steps refuses to run
-- (section 11.3, rolling deploys).

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE idem_steps
    ADD COLUMN at_most_once BOOLEAN         NOT NULL DEFAULT FALSE,
    ADD COLUMN reason       VARBINARY(64)   NOT NULL DEFAULT '',
    ADD COLUMN resolved_by  VARBINARY(200)  NOT NULL DEFAULT '',
    ADD COLUMN resolved_why VARBINARY(200)  NOT NULL DEFAULT '',
    ADD COLUMN resolved_at  DATETIME(6)     NULL;

-- +goose Down
ALTER TABLE idem_steps
    DROP COLUMN resolved_at,
    DROP COLUMN resolved_why,
    DROP COLUMN resolved_by,
    DROP COLUMN reason,
    DROP COLUMN at_most_once;
