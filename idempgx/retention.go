package idempgx

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/idemgo/idem/idemdriver"
)

var (
	_ idemdriver.Purger            = (*Driver)(nil)
	_ idemdriver.MaintenanceLocker = (*Driver)(nil)
	_ idemdriver.Inspector         = (*Driver)(nil)
	_ idemdriver.Migrator          = (*Driver)(nil)
	_ idemdriver.Partitioner       = (*Driver)(nil)
	_ idemdriver.RetentionLimiter  = (*Driver)(nil)
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
var purgeSQL = `WITH doomed AS (
	SELECT scope, key, expires_at FROM idem_keys
	WHERE ` + purgeable + `
	ORDER BY expires_at
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
DELETE FROM idem_keys AS k USING doomed AS d
WHERE k.scope = d.scope AND k.key = d.key AND k.expires_at = d.expires_at`

var countExpiredSQL = `SELECT count(*) FROM idem_keys WHERE ` + purgeable

func purgeArgs(p idemdriver.PurgeParams) pgx.NamedArgs {
	return pgx.NamedArgs{"limit": p.Limit, "older": max(p.OlderThan, 0).Microseconds(), "offset": p.ClockOffset.Microseconds()}
}

// PurgeExpired implements idemdriver.Purger with one DELETE (see purgeSQL),
// its own transaction, on a pool connection.
func (d *Driver) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	return purge(ctx, d.pool, p)
}

func purge(ctx context.Context, db execer, p idemdriver.PurgeParams) (int64, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idempgx: purge: Limit %d must be positive", p.Limit)
	}
	tag, err := db.Exec(ctx, purgeSQL, purgeArgs(p))
	if err != nil {
		return 0, fmt.Errorf("idempgx: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountExpired implements idemdriver.Purger.
func (d *Driver) CountExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	var n int64
	err := d.pool.QueryRow(ctx, countExpiredSQL, purgeArgs(p)).Scan(&n)
	return n, err
}

// maintenanceLockSQL names the maintenance lock: one per search_path schema,
// so the idem_keys tables of different schemas have a maintainer each.
const maintenanceLockKey = `hashtextextended('idem maintenance ' || current_schema(), 0)`

// TryLockMaintenance implements idemdriver.MaintenanceLocker with a session
// advisory lock, pg_try_advisory_lock, on a connection taken out of the pool
// for the lock's life (pgxpool Hijack). The lock is released by Release, or
// by PostgreSQL when that connection ends for any reason (the process died,
// the network dropped, pg_terminate_backend). The lock's PurgeExpired runs
// on that same connection, so a purge runs only while its session holds the
// lock. p is not used: the lock has no TTL.
func (d *Driver) TryLockMaintenance(ctx context.Context, _ idemdriver.LockParams) (idemdriver.MaintenanceLock, error) {
	pc, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+maintenanceLockKey+`)`).Scan(&ok); err != nil {
		conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
		return nil, err
	}
	if !ok {
		conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
		return nil, idemdriver.ErrLockHeld
	}
	return &pgLock{conn: conn}, nil
}

// pgLock is a held session advisory lock and its dedicated connection.
type pgLock struct {
	conn     *pgx.Conn
	released bool
}

// lost maps an error on the lock's connection: a connection that is closed
// (or was never usable) has lost the lock with its session.
func (l *pgLock) lost(err error) error {
	if l.released || l.conn.IsClosed() {
		return fmt.Errorf("%w: %v", idemdriver.ErrLockLost, err)
	}
	return err
}

func (l *pgLock) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	if l.released || l.conn.IsClosed() {
		return 0, idemdriver.ErrLockLost
	}
	n, err := purge(ctx, l.conn, p)
	if err != nil {
		return 0, l.lost(err)
	}
	return n, nil
}

func (l *pgLock) Refresh(ctx context.Context) error {
	if l.released || l.conn.IsClosed() {
		return idemdriver.ErrLockLost
	}
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND granted
		AND ((classid::bigint << 32) | objid::bigint) = `+maintenanceLockKey+`)`).Scan(&held)
	switch {
	case err != nil:
		l.conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
		return fmt.Errorf("%w: %v", idemdriver.ErrLockLost, err)
	case !held:
		return idemdriver.ErrLockLost
	}
	return nil
}

func (l *pgLock) Release(ctx context.Context) error {
	if l.released {
		return nil
	}
	l.released = true
	// Closing the session releases its advisory locks.
	return l.conn.Close(ctx)
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
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	var processing, succeeded, failed int64
	err = tx.QueryRow(ctx, `SELECT `+now+`, count(*),
		count(*) FILTER (WHERE state = 'PROCESSING'), count(*) FILTER (WHERE state = 'SUCCEEDED'),
		count(*) FILTER (WHERE state = 'FAILED'), min(created_at),
		count(*) FILTER (WHERE expires_at <= `+now+`),
		count(*) FILTER (WHERE state = 'PROCESSING' AND locked_until <= `+now+`)
		FROM idem_keys`, pgx.NamedArgs{"offset": p.ClockOffset.Microseconds()}).
		Scan(&st.Now, &st.Total, &processing, &succeeded, &failed, &st.Oldest, &st.Expired, &st.Stuck)
	if err != nil {
		return st, err
	}
	st.Now = st.Now.UTC()
	st.ByState[idemdriver.StateProcessing], st.ByState[idemdriver.StateSucceeded], st.ByState[idemdriver.StateFailed] = processing, succeeded, failed
	if p.TopScopes > 0 {
		rows, err := tx.Query(ctx, `SELECT scope, count(*) FROM idem_keys GROUP BY scope
			ORDER BY count(*) DESC, scope LIMIT $1`, p.TopScopes)
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

var stuckSQL = `SELECT ` + columns + `, (extract(epoch FROM ` + now + ` - locked_until) * 1000000)::bigint
	FROM idem_keys WHERE state = 'PROCESSING' AND locked_until <= ` + now + `
	ORDER BY locked_until LIMIT @limit`

// Stuck implements idemdriver.Inspector with a range read of the partial
// index on locked_until of PROCESSING records.
func (d *Driver) Stuck(ctx context.Context, p idemdriver.StuckParams) ([]idemdriver.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idempgx: stuck: Limit %d must be positive", p.Limit)
	}
	rows, err := d.pool.Query(ctx, stuckSQL, pgx.NamedArgs{"limit": p.Limit, "offset": p.ClockOffset.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (idemdriver.StuckRecord, error) {
		var overdueUS int64
		rec, err := scanRecord(row, nil, &overdueUS)
		return idemdriver.StuckRecord{Record: rec, Overdue: time.Duration(overdueUS) * time.Microsecond}, err
	})
}

// MigrationStatus implements idemdriver.Migrator.
func (d *Driver) MigrationStatus(ctx context.Context) ([]idemdriver.Migration, error) {
	p, closeDB, err := d.provider(ctx)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempgx: migration status: %w", err)
	}
	return migrationList(st), nil
}

// MigrateDown implements idemdriver.Migrator, under the migration lock.
func (d *Driver) MigrateDown(ctx context.Context) (idemdriver.Migration, error) {
	p, closeDB, err := d.provider(ctx)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	defer closeDB()
	res, err := p.Down(ctx)
	if err != nil {
		if errors.Is(err, goose.ErrNoNextVersion) || errors.Is(err, goose.ErrNoCurrentVersion) {
			return idemdriver.Migration{}, errors.New("idempgx: migrate down: no migration is applied")
		}
		return idemdriver.Migration{}, fmt.Errorf("idempgx: migrate down: %w", err)
	}
	return idemdriver.Migration{Version: res.Source.Version, Name: path.Base(res.Source.Path)}, nil
}

// migrationList converts goose's status (shared with idemsqlite's shape).
func migrationList(st []*goose.MigrationStatus) []idemdriver.Migration {
	out := make([]idemdriver.Migration, 0, len(st))
	for _, s := range st {
		m := idemdriver.Migration{Version: s.Source.Version, Name: path.Base(s.Source.Path), Applied: s.State == goose.StateApplied}
		if m.Applied && !s.AppliedAt.IsZero() {
			t := s.AppliedAt.UTC()
			m.AppliedAt = &t
		}
		out = append(out, m)
	}
	return out
}

// listSQL reads one page of records in primary-key order, each filter off
// when its parameter is empty.
var listSQL = `SELECT ` + columns + ` FROM idem_keys
	WHERE (@state = '' OR state = @state) AND (@scope = '' OR scope = @scope) AND (@key = '' OR key = @key)
	AND (scope, key) > (@after_scope, @after_key)
	ORDER BY scope, key LIMIT @limit`

// List implements idemdriver.Lister.
func (d *Driver) List(ctx context.Context, p idemdriver.ListParams) ([]idemdriver.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idempgx: list: Limit %d must be positive", p.Limit)
	}
	rows, err := d.pool.Query(ctx, listSQL, pgx.NamedArgs{"state": string(p.State), "scope": p.Scope, "key": p.Key,
		"after_scope": p.AfterScope, "after_key": p.AfterKey, "limit": p.Limit, "offset": p.ClockOffset.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (idemdriver.Record, error) {
		return scanRecord(row, nil)
	})
}

var removeSQL = `DELETE FROM idem_keys WHERE scope = @scope AND key = @key AND fencing_token = @token
	AND created_at = @created AND state = @state`

// Remove implements idemdriver.Remover.
func (d *Driver) Remove(ctx context.Context, p idemdriver.RemoveParams) (bool, error) {
	args := fenceArgs(p.FenceParams)
	args["state"] = string(p.State)
	return execFenced(ctx, d.pool, removeSQL, args)
}
