-- The maintenance lock (idemdriver.MaintenanceLocker): one lease row, taken
-- with SQLite's clock by the one idem.Maintainer that purges this file.
-- token counts the tenures: every take-over increments it, and the purge of
-- a tenure is fenced by its token. Times are integer microseconds since the
-- Unix epoch, UTC.

-- +goose Up
CREATE TABLE idem_maintenance_lock (
    name         TEXT    NOT NULL PRIMARY KEY,
    holder       TEXT    NOT NULL,
    token        INTEGER NOT NULL,
    locked_until INTEGER NOT NULL
);

-- +goose Down
DROP TABLE idem_maintenance_lock;
