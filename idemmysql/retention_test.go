package idemmysql_test

// Retention and operations on MySQL, beside the suite's Retention cases.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
	idemretention "github.com/idemgo/idem/retention"
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

// The maintenance lock is a lease row, held by no session: killing the
// leader's connections leaves it held (a session lock would have been
// freed, and on a pooled or Galera connection might never have been seen);
// once its lease has run out (the clock moved past the TTL) another process
// takes it with a greater fencing token, and the old holder's Refresh and
// purge are refused and purge nothing.
func TestMaintenanceLockOutlivesItsConnections(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	other := secondDriver(t, d).(*idemmysql.Driver)
	ctx := context.Background()
	expired(t, d, "s", 3)
	lp := idemdriver.LockParams{Holder: "first", TTL: time.Minute}
	l, err := d.TryLockMaintenance(ctx, lp)
	require.NoError(t, err)
	_, err = other.TryLockMaintenance(ctx, lp)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld)

	var holder string
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT holder FROM idem_locks WHERE name = 'maintainer'`).Scan(&holder))
	require.Equal(t, "first", holder)
	// Kill every idle connection of d's pool: the lease stays.
	d.DB().SetMaxIdleConns(0)
	d.DB().SetMaxIdleConns(2)
	require.NoError(t, l.Refresh(ctx))
	_, err = other.TryLockMaintenance(ctx, lp)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "still held")

	l2, err := other.TryLockMaintenance(ctx, idemdriver.LockParams{Holder: "second", TTL: time.Minute, ClockOffset: 2 * time.Minute})
	require.NoError(t, err, "a lease past its TTL is taken over")
	require.Greater(t, l2.FencingToken(), l.FencingToken())
	_, err = l.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.ErrorIs(t, err, idemdriver.ErrLockLost)
	require.ErrorIs(t, l.Refresh(ctx), idemdriver.ErrLockLost)
	n, err := d.CountExpired(ctx, idemdriver.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "a lost lock purges nothing")
	n, err = l2.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.NoError(t, l2.Release(ctx))
	require.NoError(t, l.Release(ctx), "releasing a lost lock is a no-op")
	l3, err := d.TryLockMaintenance(ctx, lp)
	require.NoError(t, err, "free once released")
	require.Greater(t, l3.FencingToken(), l2.FencingToken())
	require.NoError(t, l3.Release(ctx))
}

// The lock holds no connection: while it is held, the pool is whole; many
// takes and releases on a pool of one leak nothing.
func TestMaintenanceLockConnection(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	d.DB().SetMaxOpenConns(1)
	l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Minute})
	require.NoError(t, err)
	require.Zero(t, d.DB().Stats().InUse, "the lock holds no connection")
	_, err = d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
	expired(t, d, "s", 2)
	n, err := l.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err, "a purge under the lock runs on the pool's one connection")
	require.EqualValues(t, 2, n)
	require.NoError(t, l.Release(ctx))
	require.Zero(t, d.DB().Stats().InUse)
	for i := 0; i < 10; i++ {
		l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Minute})
		require.NoError(t, err)
		_, err = d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Minute})
		require.ErrorIs(t, err, idemdriver.ErrLockHeld)
		require.NoError(t, l.Release(ctx))
	}
	require.LessOrEqual(t, d.DB().Stats().OpenConnections, 1)
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
	lp := idemdriver.LockParams{TTL: time.Minute}
	require.EqualValues(t, 2, cost(func() {
		l, err = d.TryLockMaintenance(ctx, lp)
		require.NoError(t, err)
	}), "INSERT IGNORE of the lease row, the UPDATE that takes it")
	require.EqualValues(t, 2, cost(func() {
		_, err := d.TryLockMaintenance(ctx, lp)
		require.ErrorIs(t, err, idemdriver.ErrLockHeld)
	}), "a standby's attempt: INSERT IGNORE, UPDATE")
	require.EqualValues(t, 1, cost(func() { require.NoError(t, l.Refresh(ctx)) }), "UPDATE of the lease")
	expired(t, d, "t", 5)
	require.EqualValues(t, 5, cost(purge(l, 1000, 5)), "a batch under the lock: a batch's 4 and the lease's renewal in its transaction")
	require.EqualValues(t, 1, cost(func() { require.NoError(t, l.Release(ctx)) }), "UPDATE of the lease")

	// A maintainer's cycles: the lock (first cycle) or its refresh (later
	// ones), then the batches.
	expired(t, d, "u", 5)
	type counted struct {
		c idemretention.Cycle
		n int64 // statements sent when the cycle ended
	}
	cycles := make(chan counted, 10)
	before := n.Load()
	m, err := idemretention.NewMaintainer(d, idemretention.Config{Interval: 20 * time.Millisecond,
		OnCycle: func(c idemretention.Cycle) { cycles <- counted{c, n.Load()} }})
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	first, second := <-cycles, <-cycles
	m.Stop()
	require.NoError(t, first.c.Err)
	require.EqualValues(t, 5, first.c.Purged)
	require.EqualValues(t, 2+5, first.n-before, "first cycle: the lease's 2, one batch of 5")
	require.NoError(t, second.c.Err)
	require.True(t, second.c.Leader)
	require.EqualValues(t, 1+4, second.n-first.n, "a quiet cycle: the refresh, one empty batch (with its renewal)")
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
	d, _ := fromConfig(t, cfg)

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
