package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Maintainable = (*Driver)(nil)

// purgeable is the condition of a record a purge may delete: expired for
// longer than @older, and not a PROCESSING record under a live lease.
const purgeable = `expires_at <= ` + now + ` - @older
	AND NOT (state = 'PROCESSING' AND locked_until > ` + now + `)`

// purgeSQL deletes one batch of at most @limit records, oldest expiry first,
// found through the expires_at index. It is one autocommit statement: SQLite's
// write lock is held for that statement only, so requests queue behind one
// short batch at most.
var purgeSQL = `DELETE FROM idem_keys WHERE rowid IN (
	SELECT rowid FROM idem_keys WHERE ` + purgeable + ` ORDER BY expires_at LIMIT @limit)`

// purgeLockedSQL is purgeSQL fenced by the maintenance lease in the same
// statement: it deletes nothing unless the lease of @token is still live.
var purgeLockedSQL = purgeSQL + `
	AND EXISTS (SELECT 1 FROM idem_maintenance_lock
		WHERE name = 'maintainer' AND token = @token AND locked_until > ` + now + `)`

var countExpiredSQL = `SELECT count(*) FROM idem_keys WHERE ` + purgeable

func purgeArgs(p idemdriver.PurgeParams) []any {
	return []any{sql.Named("limit", p.Limit), sql.Named("older", max(p.OlderThan, 0).Microseconds()),
		sql.Named("offset", p.ClockOffset.Microseconds())}
}

// PurgeExpired implements idemdriver.Purger with one DELETE ... WHERE rowid
// IN (SELECT rowid ... LIMIT n), its own short transaction.
func (d *Driver) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	return d.purge(ctx, purgeSQL, p)
}

func (d *Driver) purge(ctx context.Context, query string, p idemdriver.PurgeParams, extra ...any) (int64, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idemsqlite: purge: Limit %d must be positive", p.Limit)
	}
	var n int64
	err := retryBusy(ctx, func() error {
		res, err := d.db.ExecContext(ctx, query, append(purgeArgs(p), extra...)...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: purge: %w", err)
	}
	return n, nil
}

// CountExpired implements idemdriver.Purger.
func (d *Driver) CountExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	var n int64
	err := d.db.QueryRowContext(ctx, countExpiredSQL, purgeArgs(p)...).Scan(&n)
	return n, err
}

// TryLockMaintenance implements idemdriver.MaintenanceLocker with the lease
// "maintainer" in idem_maintenance_lock (migration 00002), through
// idemmigrate.Leases as on the other drivers: read and written with
// SQLite's clock (which is the host's: every process sharing the file
// shares it). The lease lasts p.TTL from each Refresh; a holder that dies
// without Release is replaced once its lease has run out. Every purge of
// the lock is fenced by the lease's token in the DELETE itself
// (purgeLockedSQL), so a holder whose lease lapsed (a stalled process)
// deletes nothing, even if it has not noticed yet.
func (d *Driver) TryLockMaintenance(ctx context.Context, p idemdriver.LockParams) (idemdriver.MaintenanceLock, error) {
	if p.TTL <= 0 {
		return nil, fmt.Errorf("idemsqlite: maintenance lock: TTL %s must be positive", p.TTL)
	}
	var l idemdriver.MaintenanceLock
	err := retryBusy(ctx, func() (err error) {
		l, err = d.maintenance.TryLockMaintenance(ctx, p, func(ctx context.Context, p idemdriver.PurgeParams, lease *idemmigrate.Lease) (int64, error) {
			n, err := d.purge(ctx, purgeLockedSQL, p, sql.Named("token", lease.Token()))
			if err != nil || n > 0 {
				return n, err
			}
			// Nothing deleted: nothing to purge, or the lease is gone.
			return 0, lease.Refresh(ctx)
		})
		return err
	})
	return l, err
}

// Now implements idemdriver.Inspector: SQLite's clock (unixepoch('subsec'),
// millisecond resolution) plus offset.
func (d *Driver) Now(ctx context.Context, offset time.Duration) (time.Time, error) {
	var us int64
	err := d.db.QueryRowContext(ctx, `SELECT `+now, sql.Named("offset", offset.Microseconds())).Scan(&us)
	return idemsql.MicrosTime(us), err
}

// Stats implements idemdriver.Inspector: two aggregate reads in one read
// transaction (a WAL snapshot, which does not take the write lock).
func (d *Driver) Stats(ctx context.Context, p idemdriver.StatsParams) (st idemdriver.Stats, err error) {
	st = idemdriver.Stats{ByState: map[idemdriver.State]int64{}}
	// A read-only *sql.Tx still sends BEGIN IMMEDIATE under _txlock; a
	// dedicated connection with a plain BEGIN keeps Stats off the write lock.
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return st, err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	if _, err := conn.ExecContext(ctx, `BEGIN DEFERRED`); err != nil {
		return st, err
	}
	defer func() { err = errors.Join(err, endRead(ctx, conn)) }()
	return idemsql.QueryStats(ctx, conn, `SELECT `+now+`, count(*),
		count(*) FILTER (WHERE state = 'PROCESSING'), count(*) FILTER (WHERE state = 'SUCCEEDED'),
		count(*) FILTER (WHERE state = 'FAILED'), min(created_at),
		count(*) FILTER (WHERE expires_at <= `+now+`),
		count(*) FILTER (WHERE state = 'PROCESSING' AND locked_until <= `+now+`),
		count(*) FILTER (WHERE state = 'PROCESSING' AND locked_until IS NULL)
		FROM idem_keys`, []any{sql.Named("offset", p.ClockOffset.Microseconds())},
		`SELECT scope, count(*) FROM idem_keys GROUP BY scope
		ORDER BY count(*) DESC, scope LIMIT ?`, p.TopScopes)
}

// endRead ends the read transaction on conn with ROLLBACK. When that
// fails, the connection is discarded rather than given back to the pool
// inside a transaction, where it would pin its WAL snapshot and fail the
// next BEGIN.
func endRead(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
	if err == nil {
		return nil
	}
	// Raw's driver.ErrBadConn makes database/sql close the connection; that
	// error is the discard itself, not a failure.
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	return fmt.Errorf("idemsqlite: ending the read transaction: %w", err)
}

var stuckSQL = `SELECT ` + columns + `, coalesce(` + now + ` - locked_until, 0)
	FROM idem_keys WHERE state = 'PROCESSING' AND (locked_until IS NULL OR locked_until <= ` + now + `)
	ORDER BY locked_until NULLS FIRST LIMIT @limit`

// Stuck implements idemdriver.Inspector with a read of the partial index on
// locked_until of PROCESSING records (its NULLs, the damaged records, and
// the range up to now).
func (d *Driver) Stuck(ctx context.Context, p idemdriver.StuckParams) ([]idemdriver.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idemsqlite: stuck: Limit %d must be positive", p.Limit)
	}
	rows, err := d.db.QueryContext(ctx, stuckSQL, sql.Named("limit", p.Limit), sql.Named("offset", p.ClockOffset.Microseconds()))
	if err != nil {
		return nil, err
	}
	return idemsql.CollectRows(rows, func(rows *sql.Rows) (idemdriver.StuckRecord, error) {
		var overdueUS int64
		rec, err := scanRecord(rows, nil, &overdueUS)
		return idemdriver.StuckRecord{Record: rec, Overdue: time.Duration(overdueUS) * time.Microsecond}, err
	})
}

// MigrationStatus implements idemdriver.Migrator with idemmigrate, under
// the migration lease: each applied migration's missing tables are named.
func (d *Driver) MigrationStatus(ctx context.Context) ([]idemdriver.Migration, error) {
	m, err := d.migrator(embedded(), SchemaVersionTable)
	if err != nil {
		return nil, err
	}
	return m.Status(ctx)
}

// MigrateDown implements idemdriver.Migrator, under the migration lease.
func (d *Driver) MigrateDown(ctx context.Context) (idemdriver.Migration, error) {
	m, err := d.migrator(embedded(), SchemaVersionTable)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	return m.Down(ctx)
}

// MigrateDownDroppingRecords is MigrateDown without its refusal
// (idemdriver.ErrDropsRecords): the records or steps the rollback drops
// are lost.
func (d *Driver) MigrateDownDroppingRecords(ctx context.Context) (idemdriver.Migration, error) {
	m, err := d.migrator(embedded(), SchemaVersionTable)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	return m.DownDroppingRecords(ctx)
}

// listSQL reads one page of records (idemsql.ListSQL).
var listSQL = idemsql.ListSQL(columns + ", request")

// List implements idemdriver.Lister.
func (d *Driver) List(ctx context.Context, p idemdriver.ListParams) ([]idemdriver.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idemsqlite: list: Limit %d must be positive", p.Limit)
	}
	rows, err := d.db.QueryContext(ctx, listSQL, sql.Named("state", string(p.State)), sql.Named("scope", p.Scope),
		sql.Named("key", p.Key), sql.Named("after_scope", p.AfterScope), sql.Named("after_key", p.AfterKey),
		sql.Named("limit", p.Limit), sql.Named("offset", p.ClockOffset.Microseconds()))
	if err != nil {
		return nil, err
	}
	return idemsql.CollectRows(rows, func(rows *sql.Rows) (idemdriver.Record, error) { return scanWithRequest(rows) })
}

var removeSQL = `DELETE FROM idem_keys WHERE scope = @scope AND key = @key AND fencing_token = @token
	AND created_at = @created AND state = @state`

// Remove implements idemdriver.Remover.
func (d *Driver) Remove(ctx context.Context, p idemdriver.RemoveParams) (bool, error) {
	var n int64
	err := retryBusy(ctx, func() error {
		res, err := d.db.ExecContext(ctx, removeSQL, sql.Named("scope", p.Scope), sql.Named("key", p.Key),
			sql.Named("token", p.FencingToken), sql.Named("created", p.CreatedAt.UnixMicro()), sql.Named("state", string(p.State)))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n == 1, err
}
