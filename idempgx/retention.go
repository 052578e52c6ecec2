package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var (
	_ idemdriver.Maintainable     = (*Driver)(nil)
	_ idemdriver.Partitioner      = (*Driver)(nil)
	_ idemdriver.RetentionLimiter = (*Driver)(nil)
)

// purgeable is the condition of a record that a purge may delete: expired
// for longer than @older, and not a PROCESSING record under a live lease.
const purgeable = `expires_at <= ` + now + ` - @older::bigint * interval '1 microsecond'
	AND NOT (state = 'PROCESSING' AND locked_until > ` + now + `)`

// purgeSQL deletes one batch. The inner SELECT walks the expires_at index
// from the oldest record and locks at most @limit rows, skipping rows that a
// claim holds (FOR UPDATE SKIP LOCKED): the purge never waits for a request
// and a request never waits long for the purge, which holds its row locks for
// one short statement. A row re-claimed between the index read and its lock
// is re-checked against the condition on its latest version (READ COMMITTED)
// and left alone. The join on the whole primary key serves the plain
// (scope, key) and the partitioned (scope, key, expires_at) tables alike.
var purgeSQL = purgeDoomed + `
` + purgeDelete

const (
	purgeDoomed = `WITH doomed AS (
	SELECT scope, key, expires_at FROM idem_keys
	WHERE ` + purgeable + `
	ORDER BY expires_at
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)`
	purgeDelete = `DELETE FROM idem_keys AS k USING doomed AS d
WHERE k.scope = d.scope AND k.key = d.key AND k.expires_at = d.expires_at`
)

// purgePartSQL is purgeSQL on the partitioned table: it deletes the purged
// records' steps too (see withStepsGone).
var purgePartSQL = purgeDoomed + `, gone AS (` + purgeDelete + `
RETURNING k.scope, k.key, k.created_at)` + stepsGone

var countExpiredSQL = `SELECT count(*) FROM idem_keys WHERE ` + purgeable

func purgeArgs(p idemdriver.PurgeParams) pgx.NamedArgs {
	return pgx.NamedArgs{"limit": p.Limit, "older": max(p.OlderThan, 0).Microseconds(), "offset": p.ClockOffset.Microseconds()}
}

// PurgeExpired implements idemdriver.Purger with one DELETE (see purgeSQL),
// its own transaction, on a pool connection.
func (d *Driver) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	return d.purge(ctx, d.pool, p)
}

func (d *Driver) purge(ctx context.Context, db execer, p idemdriver.PurgeParams) (int64, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idempgx: purge: Limit %d must be positive", p.Limit)
	}
	q := purgeSQL
	if d.part != nil {
		q = purgePartSQL
	}
	tag, err := db.Exec(ctx, d.q(q), purgeArgs(p))
	if err != nil {
		return 0, fmt.Errorf("idempgx: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountExpired implements idemdriver.Purger.
func (d *Driver) CountExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	var n int64
	err := d.pool.QueryRow(ctx, d.q(countExpiredSQL), purgeArgs(p)).Scan(&n)
	return n, err
}

// TryLockMaintenance implements idemdriver.MaintenanceLocker with the lease
// "maintainer" in idem_locks of the search_path schema
// (idemmigrate.Leases): one maintainer per schema, elected by a row written
// with the database's clock and held by no session, so that it holds
// behind pgbouncer's transaction pooling (a session advisory lock would
// stay on a pooled server connection, and a second leader could take it
// through another). It lasts p.TTL from each take or Refresh. Each batch of
// the lock's PurgeExpired is one transaction that renews the lease first
// (which locks its row until COMMIT: a take-over waits for the batch) and
// deletes nothing when the lease is no longer this holder's.
func (d *Driver) TryLockMaintenance(ctx context.Context, p idemdriver.LockParams) (idemdriver.MaintenanceLock, error) {
	_, leases := d.db()
	l, err := leases.TryLockMaintenance(ctx, p, func(ctx context.Context, p idemdriver.PurgeParams, lease *idemmigrate.Lease) (int64, error) {
		if p.Limit <= 0 {
			return 0, fmt.Errorf("idempgx: purge: Limit %d must be positive", p.Limit)
		}
		var n int64
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			q, args := lease.Fence()
			tag, err := tx.Exec(ctx, q, args...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return idemdriver.ErrLockLost
			}
			n, err = d.purge(ctx, tx, p)
			return err
		})
		return n, err
	})
	if err != nil && !errors.Is(err, idemdriver.ErrLockHeld) {
		err = fmt.Errorf("idempgx: maintenance lock: %w", poolerErr(err))
	}
	return l, err
}

// Now implements idemdriver.Inspector: statement_timestamp() plus offset.
func (d *Driver) Now(ctx context.Context, offset time.Duration) (time.Time, error) {
	return d.dbNow(ctx, offset)
}

// Stats implements idemdriver.Inspector: two aggregate reads (a full scan of
// idem_keys each) in one REPEATABLE READ, read-only transaction, so the
// totals and the top scopes agree.
func (d *Driver) Stats(ctx context.Context, p idemdriver.StatsParams) (idemdriver.Stats, error) {
	st := idemdriver.Stats{ByState: map[idemdriver.State]int64{}}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return st, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // read only: nothing to undo; pgx closes a connection whose rollback fails
	var processing, succeeded, failed int64
	err = tx.QueryRow(ctx, d.q(`SELECT `+now+`, count(*),
		count(*) FILTER (WHERE state = 'PROCESSING'), count(*) FILTER (WHERE state = 'SUCCEEDED'),
		count(*) FILTER (WHERE state = 'FAILED'), min(created_at),
		count(*) FILTER (WHERE expires_at <= `+now+`),
		count(*) FILTER (WHERE state = 'PROCESSING' AND locked_until <= `+now+`),
		count(*) FILTER (WHERE state = 'PROCESSING' AND locked_until IS NULL)
		FROM idem_keys`), pgx.NamedArgs{"offset": p.ClockOffset.Microseconds()}).
		Scan(&st.Now, &st.Total, &processing, &succeeded, &failed, &st.Oldest, &st.Expired, &st.Stuck, &st.Damaged)
	if err != nil {
		return st, err
	}
	st.Now = st.Now.UTC()
	st.ByState[idemdriver.StateProcessing], st.ByState[idemdriver.StateSucceeded], st.ByState[idemdriver.StateFailed] = processing, succeeded, failed
	st.ByState[idemdriver.StateUnknown] = st.Total - processing - succeeded - failed // the CHECK allows no other state
	if p.TopScopes > 0 {
		rows, err := tx.Query(ctx, d.q(`SELECT scope, count(*) FROM idem_keys GROUP BY scope
			ORDER BY count(*) DESC, scope LIMIT $1`), p.TopScopes)
		if err != nil {
			return st, err
		}
		st.TopScopes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (idemdriver.ScopeCount, error) {
			var sc idemdriver.ScopeCount
			return sc, row.Scan(&sc.Scope, &sc.Count)
		})
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

var stuckSQL = `SELECT ` + columns + `, coalesce((extract(epoch FROM ` + now + ` - locked_until) * 1000000)::bigint, 0)
	FROM idem_keys WHERE state = 'PROCESSING' AND (locked_until IS NULL OR locked_until <= ` + now + `)
	ORDER BY locked_until NULLS FIRST LIMIT @limit`

// Stuck implements idemdriver.Inspector with a read of the partial index on
// locked_until of PROCESSING records (its NULLs, the damaged records, and
// the range up to now).
func (d *Driver) Stuck(ctx context.Context, p idemdriver.StuckParams) ([]idemdriver.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idempgx: stuck: Limit %d must be positive", p.Limit)
	}
	rows, err := d.pool.Query(ctx, d.q(stuckSQL), pgx.NamedArgs{"limit": p.Limit, "offset": p.ClockOffset.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (idemdriver.StuckRecord, error) {
		var overdueUS int64
		rec, err := scanRecord(row, nil, &overdueUS)
		return idemdriver.StuckRecord{Record: rec, Overdue: time.Duration(overdueUS) * time.Microsecond}, err
	})
}

// MigrationStatus implements idemdriver.Migrator with idemmigrate, under
// the migration lease: each applied migration's missing tables are named.
func (d *Driver) MigrationStatus(ctx context.Context) ([]idemdriver.Migration, error) {
	fsys, table := d.migrationSet()
	m, err := d.migrator(ctx, fsys, table)
	if err != nil {
		return nil, err
	}
	list, err := m.Status(ctx)
	return list, poolerErr(err)
}

// MigrateDown implements idemdriver.Migrator, under the migration lease.
func (d *Driver) MigrateDown(ctx context.Context) (idemdriver.Migration, error) {
	fsys, table := d.migrationSet()
	m, err := d.migrator(ctx, fsys, table)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	mig, err := m.Down(ctx)
	return mig, poolerErr(err)
}

// MigrateDownDroppingRecords is MigrateDown without its refusal
// (idemdriver.ErrDropsRecords): the records or steps the rollback drops
// are lost.
func (d *Driver) MigrateDownDroppingRecords(ctx context.Context) (idemdriver.Migration, error) {
	fsys, table := d.migrationSet()
	m, err := d.migrator(ctx, fsys, table)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	mig, err := m.DownDroppingRecords(ctx)
	return mig, poolerErr(err)
}

// listSQL reads one page of records (idemsql.ListSQL).
var listSQL = idemsql.ListSQL(columns + ", request")

// List implements idemdriver.Lister.
func (d *Driver) List(ctx context.Context, p idemdriver.ListParams) ([]idemdriver.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idempgx: list: Limit %d must be positive", p.Limit)
	}
	if err := textable("scope", p.Scope, "key", p.Key, "after scope", p.AfterScope, "after key", p.AfterKey); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, d.q(listSQL), pgx.NamedArgs{"state": string(p.State), "scope": p.Scope, "key": p.Key,
		"after_scope": p.AfterScope, "after_key": p.AfterKey, "limit": p.Limit, "offset": p.ClockOffset.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanWithRequest)
}

const removeDelete = `DELETE FROM idem_keys WHERE scope = @scope AND key = @key AND fencing_token = @token
	AND created_at = @created AND state = @state`

// removeSQL deletes one record (its steps by the foreign key); removePartSQL
// on the partitioned table, its life's steps in the same statement.
var removeSQL, removePartSQL = removeDelete, withStepsGone(removeDelete, "")

// Remove implements idemdriver.Remover.
func (d *Driver) Remove(ctx context.Context, p idemdriver.RemoveParams) (bool, error) {
	if err := fenceTextable(p.FenceParams); err != nil {
		return false, err
	}
	q := removeSQL
	if d.part != nil {
		q = removePartSQL
	}
	return execFenced(ctx, d.pool, d.q(q), []any{pgx.NamedArgs{"scope": p.Scope, "key": p.Key,
		"token": p.FencingToken, "created": p.CreatedAt, "state": string(p.State)}})
}
