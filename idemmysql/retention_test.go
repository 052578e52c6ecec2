package idemmysql_test

// Retention and operations on MySQL, beside the suite's Retention cases.

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
)

// expired claims n keys of scope that expired an hour ago.
func expired(t *testing.T, d idemdriver.Driver, scope string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		p := params(scope, fmt.Sprint("k", i), "b")
		p.Retention, p.LeaseDuration, p.ClockOffset = time.Hour, time.Second, -2*time.Hour
		res, err := d.Claim(context.Background(), p)
		require.NoError(t, err)
		require.True(t, res.Claimed)
	}
}

// The purge skips the rows another transaction holds (FOR UPDATE SKIP
// LOCKED): it neither waits for them nor deletes them.
func TestPurgeSkipsLockedRows(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	expired(t, d, "s", 3)
	tx, err := d.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	var one int
	// By primary key, as a claim or a completion locks its row. (A table
	// scan FOR UPDATE would lock every row it reads: MariaDB 10.11 keeps
	// those locks even under READ COMMITTED.)
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT 1 FROM idem_keys WHERE scope = 's' AND `key` = 'k1' FOR UPDATE").Scan(&one))
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	n, err := d.PurgeExpired(qctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err, "does not wait for the locked row")
	require.EqualValues(t, 2, n)
	require.Less(t, time.Since(start), 2*time.Second)
	_, err = d.Get(ctx, idemdriver.GetParams{Scope: "s", Key: "k1"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	n, err = d.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// A batch larger than one DELETE's worth of keys is deleted by several
// DELETEs in its transaction.
func TestPurgeLargeBatch(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	const rows = 2500
	var values []any
	q := "INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token, created_at, updated_at, expires_at, attempts) VALUES "
	for i := 0; i < rows; i++ {
		if i > 0 {
			q += ","
		}
		q += "(?, ?, 'POST', '/', 'f', 'SUCCEEDED', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, 1)"
		// Keys of every byte value (quotes and NULs included), up to the
		// longest the column holds.
		key := []byte(fmt.Sprintf("%05d", i))
		for j := len(key); j < 5+i%(idemmysql.MaxKeyBytes-4); j++ {
			key = append(key, byte(i*7+j))
		}
		values = append(values, fmt.Sprintf("scope-'%d", i%7), key)
	}
	_, err := d.DB().ExecContext(ctx, q, values...)
	require.NoError(t, err)
	n, err := d.CountExpired(ctx, idemdriver.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, rows, n)
	n, err = d.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 2400})
	require.NoError(t, err)
	require.EqualValues(t, 2400, n)
	n, err = d.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 2400})
	require.NoError(t, err)
	require.EqualValues(t, 100, n)
	var left int
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM idem_keys`).Scan(&left))
	require.Zero(t, left)
}

// The maintenance lock dies with its connection: when the leader's session
// is killed, its lock methods report ErrLockLost, its purge deletes nothing,
// and another process takes the lock.
func TestMaintenanceLockDiesWithItsConnection(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	other := secondDriver(t, d).(*idemmysql.Driver)
	ctx := context.Background()
	expired(t, d, "s", 3)
	l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{})
	require.NoError(t, err)
	_, err = other.TryLockMaintenance(ctx, idemdriver.LockParams{})
	require.ErrorIs(t, err, idemdriver.ErrLockHeld)

	var database string
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database))
	var holder sql.NullInt64
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT IS_USED_LOCK(?)`, idemmysql.MaintenanceLockName(database)).Scan(&holder))
	require.True(t, holder.Valid, "the lock is held")
	_, err = d.DB().ExecContext(ctx, fmt.Sprintf("KILL %d", holder.Int64))
	require.NoError(t, err)

	_, err = l.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.ErrorIs(t, err, idemdriver.ErrLockLost)
	require.ErrorIs(t, l.Refresh(ctx), idemdriver.ErrLockLost)
	n, err := d.CountExpired(ctx, idemdriver.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "a lost lock purges nothing")
	var l2 idemdriver.MaintenanceLock
	require.Eventually(t, func() bool {
		l2, err = other.TryLockMaintenance(ctx, idemdriver.LockParams{})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	n, err = l2.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.NoError(t, l2.Release(ctx))
	require.NoError(t, l.Release(ctx))
}

// The lock's connection never returns to the pool: after Release, every
// pooled session holds no lock, and the pool is whole again.
func TestMaintenanceLockConnection(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	d.DB().SetMaxOpenConns(2)
	l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{})
	require.NoError(t, err)
	require.Equal(t, 1, d.DB().Stats().InUse, "the lock holds one connection")
	// The second connection is the pool's only one meanwhile; a claim
	// still runs.
	_, err = d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	require.Zero(t, d.DB().Stats().InUse)
	var database string
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database))
	var free bool
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT IS_FREE_LOCK(?)`, idemmysql.MaintenanceLockName(database)).Scan(&free))
	require.True(t, free)
	// Lock and release many times on a pool of two: no connection leaks
	// and no pooled session keeps the lock (GET_LOCK is re-entrant per
	// session, so a leaked one would take it twice).
	for i := 0; i < 10; i++ {
		l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{})
		require.NoError(t, err)
		_, err = d.TryLockMaintenance(ctx, idemdriver.LockParams{})
		require.ErrorIs(t, err, idemdriver.ErrLockHeld)
		require.NoError(t, l.Release(ctx))
	}
	require.LessOrEqual(t, d.DB().Stats().OpenConnections, 2)
}

// What each maintenance operation costs in statements (see "Retention and
// maintenance" in the package documentation), counted on the wire.
func TestMaintenanceStatementBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wrap, n := counting()
	url, _ := dbtest.MySQLURL(t)
	d, err := idemmysql.OpenWrapped(ctx, url, wrap)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(ctx))
	cost := func(f func()) int64 {
		t.Helper()
		before := n.Load()
		f()
		return n.Load() - before
	}
	purge := func(l interface {
		PurgeExpired(context.Context, idemdriver.PurgeParams) (int64, error)
	}, limit int, want int64) func() {
		return func() {
			got, err := l.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: limit})
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
	}
	require.EqualValues(t, 3, cost(purge(d, 1000, 0)), "nothing to purge: START TRANSACTION, SELECT, COMMIT")
	expired(t, d, "s", 5)
	require.EqualValues(t, 4, cost(purge(d, 1000, 5)), "START TRANSACTION, SELECT ... FOR UPDATE SKIP LOCKED, DELETE, COMMIT")

	var l idemdriver.MaintenanceLock
	require.EqualValues(t, 2, cost(func() {
		l, err = d.TryLockMaintenance(ctx, idemdriver.LockParams{})
		require.NoError(t, err)
	}), "SELECT DATABASE(), SELECT GET_LOCK")
	require.EqualValues(t, 2, cost(func() {
		_, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{})
		require.ErrorIs(t, err, idemdriver.ErrLockHeld)
	}), "a standby's attempt: SELECT DATABASE(), SELECT GET_LOCK")
	require.EqualValues(t, 1, cost(func() { require.NoError(t, l.Refresh(ctx)) }), "SELECT IS_USED_LOCK")
	expired(t, d, "t", 5)
	require.EqualValues(t, 4, cost(purge(l, 1000, 5)), "a batch under the lock costs what a batch costs")
	require.EqualValues(t, 1, cost(func() { require.NoError(t, l.Release(ctx)) }), "SELECT RELEASE_LOCK")

	// A maintainer's cycles: the lock (first cycle) or its refresh (later
	// ones), then the batches.
	expired(t, d, "u", 5)
	type counted struct {
		c idem.MaintenanceCycle
		n int64 // statements sent when the cycle ended
	}
	cycles := make(chan counted, 10)
	before := n.Load()
	m, err := idem.NewMaintainer(d, idem.MaintainerConfig{Interval: 20 * time.Millisecond,
		OnCycle: func(c idem.MaintenanceCycle) { cycles <- counted{c, n.Load()} }})
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	first, second := <-cycles, <-cycles
	m.Stop()
	require.NoError(t, first.c.Err)
	require.EqualValues(t, 5, first.c.Purged)
	require.EqualValues(t, 2+4, first.n-before, "first cycle: GET_LOCK's 2, one batch of 4")
	require.NoError(t, second.c.Err)
	require.True(t, second.c.Leader)
	require.EqualValues(t, 1+3, second.n-first.n, "a quiet cycle: the refresh, one empty batch")
}

// Migration status and down on a pool from New without parseTime and with
// a session time zone 9 hours east of UTC: AppliedAt is still UTC, and
// rolling back the only migration drops idem_keys.
func TestMigrateStatusAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(dbtest.MySQLDSN(t))
	require.NoError(t, err)
	cfg.ParseTime = false
	cfg.Params = map[string]string{"time_zone": "'+09:00'"}
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	d := idemmysql.New(db)
	t.Cleanup(func() { d.Close() })

	list, err := d.MigrationStatus(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, list)
	for _, m := range list {
		require.False(t, m.Applied, "a new database: %s pending", m.Name)
		require.Nil(t, m.AppliedAt)
	}
	_, err = d.MigrateDown(ctx)
	require.ErrorContains(t, err, "no migration is applied")

	require.NoError(t, d.Migrate(ctx))
	now, err := d.Now(ctx, 0)
	require.NoError(t, err)
	list, err = d.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, "00001_idem_keys.sql", list[0].Name)
	for _, m := range list {
		require.True(t, m.Applied, m.Name)
		require.NotNil(t, m.AppliedAt, m.Name)
		require.WithinDuration(t, now, *m.AppliedAt, time.Minute, "in UTC, whatever the session's time zone")
	}

	for i := len(list) - 1; i >= 0; i-- {
		down, err := d.MigrateDown(ctx)
		require.NoError(t, err)
		require.Equal(t, list[i].Version, down.Version)
		require.Equal(t, list[i].Name, down.Name)
	}
	require.False(t, tableExists(t, d, "idem_keys"))
	_, err = d.MigrateDown(ctx)
	require.ErrorContains(t, err, "no migration is applied")
	require.NoError(t, d.Migrate(ctx), "and up again")
	require.True(t, tableExists(t, d, "idem_keys"))
	_, err = d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err, "the prepared statements follow the new table")
}
