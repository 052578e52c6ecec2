package idemmigrate

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// DefaultLeaseTable is the lease table of PostgreSQL and MySQL stores.
const DefaultLeaseTable = "idem_locks"

// Leases is a lease table: named locks, each one row (name, holder, token,
// locked_until) written with the database's clock. Taking a lease is one
// compare-and-set on its row: it succeeds only when the row's lease has run
// out (locked_until <= now) or was released, and then increments the row's
// fencing token. Renewing and releasing compare the token. Every step is a
// statement of its own (or part of the caller's transaction, see
// Lease.Fence), so the leases need no session: they hold behind a
// transaction pooler (pgbouncer pool_mode=transaction), where a session
// lock (pg_advisory_lock, GET_LOCK) would stay on a pooled server
// connection, and across the nodes of a Galera cluster, where GET_LOCK is
// local to a node but the row is replicated and two nodes' writes of it
// conflict at certification.
//
// A holder that dies is replaced once its lease has run out (its TTL after
// its last renewal); a holder that stalls past its TTL finds its Refresh
// and its fenced writes refused (idemdriver.ErrLockLost), since the row's
// token has moved on.
type Leases struct {
	// Conflict, when set, reports the errors that mean another process
	// wrote the lease row at the same moment (MySQL: deadlock 1213, lock
	// wait timeout 1205, and on Galera a certification failure, which is
	// reported as 1213): a take that meets one is ErrLockHeld, a renewal
	// ErrLockLost. Set it before the first use. Default: none (PostgreSQL
	// and SQLite take and renew in one statement that waits for the row).
	Conflict func(error) bool
	// Prefix, when set, returns text put before every statement that
	// TryAcquire, Refresh, FenceTx and Release run on a lease row (Fence
	// returns its statement bare), for a database whose nodes may lag:
	// on a MariaDB Galera node, "SET STATEMENT wsrep_sync_wait=15 FOR "
	// makes the statement first wait until the node has applied every
	// write set committed anywhere in the cluster before it began. Without
	// it, a take on one node right after a release (or a take-over) on
	// another reads the row as it was: the UPDATE's WHERE finds the old
	// lease live (ErrLockHeld for a free lease), or takes a lapsed lease
	// that certification then refuses (1213, ErrLockHeld again). Safety
	// does not depend on it (certification refuses any write based on a
	// stale row), liveness does. It is called once per statement; the
	// driver caches what it detects. Set it before the first use.
	// Default: none.
	Prefix func(ctx context.Context) (string, error)
	// Migrated says that a migration of the driver's creates the table
	// (SQLite's idem_maintenance_lock, migration 00002): Ensure then only
	// checks that it exists, so that the migration still finds it absent.
	Migrated bool

	db      *sql.DB
	dialect Dialect
	table   string
	ensured atomic.Bool
}

// prefix returns Prefix's text, or "" without one.
func (l *Leases) prefix(ctx context.Context) (string, error) {
	if l.Prefix == nil {
		return "", nil
	}
	p, err := l.Prefix(ctx)
	if err != nil {
		return "", fmt.Errorf("lease table %s: %w", l.table, err)
	}
	return p, nil
}

// conflict reports whether err is a Conflict.
func (l *Leases) conflict(err error) bool { return err != nil && l.Conflict != nil && l.Conflict(err) }

// NewLeases returns the lease table named table (DefaultLeaseTable when
// empty; it may be schema-qualified on PostgreSQL) on db, in dialect's SQL.
// The table is created by Ensure.
func NewLeases(db *sql.DB, dialect Dialect, table string) *Leases {
	if table == "" {
		table = DefaultLeaseTable
	}
	return &Leases{db: db, dialect: dialect, table: table}
}

// Table is the lease table's name.
func (l *Leases) Table() string { return l.table }

// Ensure creates the lease table unless it exists. It is safe to call from
// many processes at once: on PostgreSQL the CREATE runs in a transaction
// under a transaction-scoped advisory lock (concurrent CREATE TABLE IF NOT
// EXISTS can otherwise fail with 23505 on pg_type), which is released at
// COMMIT and so cannot stay on a pooled connection; MySQL and SQLite
// serialize CREATE TABLE themselves. On Galera (total order isolation) the
// CREATEs of several nodes at once can abort one another with a Conflict
// (1213): Ensure then looks for the table again, up to five times.
func (l *Leases) Ensure(ctx context.Context) error {
	if l.ensured.Load() {
		return nil
	}
	var err error
	// A Conflict here is another node's CREATE of the same table at the
	// same moment (Galera: a TOI statement aborts a concurrent one with
	// 1213): the table is then looked for again.
	for range 5 {
		var ok bool
		ok, err = TableExists(ctx, l.db, l.dialect, l.table)
		switch {
		case err == nil && !ok && l.Migrated:
			err = errors.New("missing: run Migrate first")
		case err == nil && !ok:
			err = l.create(ctx)
		}
		if !l.conflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lease table %s: %w", l.table, err)
	}
	l.ensured.Store(true)
	return nil
}

func (l *Leases) create(ctx context.Context) error {
	create := fmt.Sprintf(l.dialect.lockTable, l.table)
	if l.dialect != Postgres {
		_, err := l.db.ExecContext(ctx, create)
		return err
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	// After Commit a no-op; after a failure, that failure is the error to
	// report (DDL here is transactional: nothing stays).
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idem lease table ' || $1 || ' ' || coalesce(current_schema(), ''), 0))`, l.table); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, create); err != nil {
		return err
	}
	return tx.Commit()
}

// TableExists reports whether table exists in db's current schema
// (PostgreSQL: as to_regclass resolves it, so a schema-qualified name
// works) or database.
func TableExists(ctx context.Context, db Queryer, dialect Dialect, table string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, dialect.tableExists, table).Scan(&ok)
	return ok, err
}

// LeaseParams name and shape one lease.
type LeaseParams struct {
	// Name is the lock's name, unique per lease table.
	Name string
	// Holder names the process, for operators (stored in the row).
	Holder string
	// TTL is how long the lease lasts past each take or Refresh. Must be positive.
	TTL time.Duration
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// TryAcquire takes the lease p.Name without waiting. It returns
// idemdriver.ErrLockHeld when another holder's lease is live, or when the
// row was written by another process at the same moment (a Galera
// certification conflict or a deadlock, which MySQL reports as errors).
func (l *Leases) TryAcquire(ctx context.Context, p LeaseParams) (*Lease, error) {
	if p.TTL <= 0 {
		return nil, fmt.Errorf("lease %s: TTL %s must be positive", p.Name, p.TTL)
	}
	if err := l.Ensure(ctx); err != nil {
		return nil, err
	}
	x := &Lease{l: l, name: p.Name, ttl: p.TTL, offset: p.ClockOffset}
	now, ttl := l.dialect.now(p.ClockOffset.Microseconds()), p.TTL.Microseconds()
	d := l.dialect
	if d.upsert {
		q := fmt.Sprintf(`INSERT INTO %[1]s AS l (name, holder, token, locked_until)
VALUES (%[2]s, %[3]s, 1, %[4]s + %[5]d)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = l.token + 1, locked_until = excluded.locked_until
WHERE l.locked_until <= %[4]s
RETURNING token`, l.table, d.ph(1), d.ph(2), now, ttl)
		err := l.db.QueryRowContext(ctx, q, p.Name, p.Holder).Scan(&x.token)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, idemdriver.ErrLockHeld
		}
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", p.Name, err)
		}
		return x, nil
	}
	// MySQL: the row is made to exist (a lapsed lease of token 0), then
	// taken by a conditional UPDATE, which remembers the new token with
	// LAST_INSERT_ID(expr): the driver reads it from the statement's reply.
	pre, err := l.prefix(ctx)
	if err != nil {
		return nil, err
	}
	_, err = l.db.ExecContext(ctx, pre+`INSERT IGNORE INTO `+l.table+` (name, holder, token, locked_until) VALUES (?, '', 0, 0)`, p.Name)
	if err != nil && !l.conflict(err) { // a conflict: another node inserted the row at the same moment
		return nil, fmt.Errorf("lease %s: %w", p.Name, err)
	}
	res, err := l.db.ExecContext(ctx, pre+fmt.Sprintf(`UPDATE %s SET holder = ?, token = LAST_INSERT_ID(token + 1), locked_until = %s + %d
WHERE name = ? AND locked_until <= %s`, l.table, now, ttl, now), p.Holder, p.Name)
	if l.conflict(err) {
		return nil, fmt.Errorf("%w: lease %s: %v", idemdriver.ErrLockHeld, p.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", p.Name, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", p.Name, err)
		}
		return nil, idemdriver.ErrLockHeld
	}
	if x.token, err = res.LastInsertId(); err != nil {
		return nil, fmt.Errorf("lease %s: %w", p.Name, err)
	}
	return x, nil
}

// Acquire takes the lease p.Name, waiting up to wait for another holder's
// lease to be released or to run out (polled every 50 ms to 1 s). It
// returns an error naming the holder when the wait ends first.
func (l *Leases) Acquire(ctx context.Context, p LeaseParams, wait time.Duration) (*Lease, error) {
	deadline := time.Now().Add(wait)
	pause := 50 * time.Millisecond
	for {
		x, err := l.TryAcquire(ctx, p)
		if !errors.Is(err, idemdriver.ErrLockHeld) {
			return x, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("lease %s not obtained within %s (held by %s): %w", p.Name, wait, l.holder(ctx, p.Name), err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lease %s: %w", p.Name, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// holder names the lease's current holder, for an error message.
func (l *Leases) holder(ctx context.Context, name string) string {
	var h string
	pre, err := l.prefix(ctx)
	if err != nil {
		return "unknown"
	}
	if err := l.db.QueryRowContext(ctx, pre+`SELECT holder FROM `+l.table+` WHERE name = `+l.dialect.ph(1), name).Scan(&h); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%q", h)
}

// Lease is a held lease. Its methods are not safe for concurrent use.
type Lease struct {
	l        *Leases
	name     string
	token    int64
	ttl      time.Duration
	offset   time.Duration
	released bool
}

// Token is the lease's fencing token: it grows with every take of the
// lease's name, so a later holder's token is always greater.
func (x *Lease) Token() int64 { return x.token }

// renewSQL extends the lease when it is still this token's and live; the
// new locked_until always differs from the old (MySQL counts only changed
// rows).
func (x *Lease) renewSQL() (string, []any) {
	d := x.l.dialect
	now := d.now(x.offset.Microseconds())
	return fmt.Sprintf(`UPDATE %s SET locked_until = %s(%s + %d, locked_until + 1)
WHERE name = %s AND token = %s AND locked_until > %s`, x.l.table, d.greatest, now, x.ttl.Microseconds(), d.ph(1), d.ph(2), now),
		[]any{x.name, x.token}
}

// Fence returns the statement and arguments that renew the lease inside the
// caller's transaction: run it first; one row affected means the lease is
// still held, and its row stays locked (or, on Galera, certified against a
// concurrent take-over) until the transaction ends, so no other holder can
// take the lease while the transaction's writes are pending. Zero rows: the
// lease is lost; roll back and return idemdriver.ErrLockLost.
func (x *Lease) Fence() (query string, args []any) { return x.renewSQL() }

// Queryer is a *sql.DB, *sql.Conn or *sql.Tx.
type Queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Execer is a *sql.DB, *sql.Conn or *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// FenceTx runs Fence in tx (a database/sql transaction) and returns
// idemdriver.ErrLockLost when the lease is no longer held.
func (x *Lease) FenceTx(ctx context.Context, tx Execer) error {
	if x.released {
		return idemdriver.ErrLockLost
	}
	pre, err := x.l.prefix(ctx)
	if err != nil {
		return err
	}
	q, args := x.renewSQL()
	res, err := tx.ExecContext(ctx, pre+q, args...)
	if x.l.conflict(err) {
		return fmt.Errorf("%w: another process wrote the lease at the same moment: %v", idemdriver.ErrLockLost, err)
	}
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(idemdriver.ErrLockLost, err)
	}
	return nil
}

// Refresh extends the lease by its TTL. It returns idemdriver.ErrLockLost
// when the lease ran out and another holder took it, or when it was
// released.
func (x *Lease) Refresh(ctx context.Context) error {
	if x.released {
		return idemdriver.ErrLockLost
	}
	err := x.FenceTx(ctx, x.l.db)
	if err != nil && !errors.Is(err, idemdriver.ErrLockLost) {
		return fmt.Errorf("lease %s: %w", x.name, err)
	}
	return err
}

// Release gives the lease up (idempotent): its row is marked free, so that
// another process may take it at once. A lease already taken over is left
// to its new holder.
func (x *Lease) Release(ctx context.Context) error {
	if x.released {
		return nil
	}
	x.released = true
	d := x.l.dialect
	pre, err := x.l.prefix(ctx)
	if err != nil {
		return fmt.Errorf("lease %s: release: %w", x.name, err)
	}
	_, err = x.l.db.ExecContext(ctx, pre+`UPDATE `+x.l.table+` SET locked_until = 0 WHERE name = `+d.ph(1)+` AND token = `+d.ph(2), x.name, x.token)
	if err != nil {
		return fmt.Errorf("lease %s: release: %w", x.name, err)
	}
	return nil
}

// Keep renews the lease every TTL/3 until the returned stop is called, and
// cancels the returned context when a renewal finds the lease lost (or
// fails until the lease must have run out): work done under the lease runs
// with that context, so it stops when the lease is gone. stop returns the
// error that cancelled the context, if any.
func (x *Lease) Keep(ctx context.Context) (context.Context, func() error) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		last := time.Now()
		t := time.NewTicker(x.ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := x.Refresh(ctx)
			switch {
			case err == nil:
				last = time.Now()
			case errors.Is(err, idemdriver.ErrLockLost) || time.Since(last) >= x.ttl:
				cancel(fmt.Errorf("lease %s: %w", x.name, errors.Join(idemdriver.ErrLockLost, err)))
				return
			}
		}
	}()
	return ctx, func() error {
		close(done)
		<-finished
		err := context.Cause(ctx)
		if ctx.Err() == nil {
			err = nil
		}
		cancel(nil)
		return err
	}
}

// MaintenanceLeaseName is the lease of idem's maintainer (retention.Maintainer),
// one per lease table.
const MaintenanceLeaseName = "maintainer"

// PurgeFunc deletes one batch of expired records fenced by lease: in the
// batch's transaction (or statement), it deletes nothing unless the lease
// is still held, and returns idemdriver.ErrLockLost when it is not.
type PurgeFunc func(ctx context.Context, p idemdriver.PurgeParams, lease *Lease) (int64, error)

// TryLockMaintenance implements idemdriver.MaintenanceLocker for a driver:
// the lease MaintenanceLeaseName in l, taken for p.TTL with p.ClockOffset,
// whose purges run purge.
func (l *Leases) TryLockMaintenance(ctx context.Context, p idemdriver.LockParams, purge PurgeFunc) (idemdriver.MaintenanceLock, error) {
	if p.TTL <= 0 {
		return nil, fmt.Errorf("maintenance lock: TTL %s must be positive", p.TTL)
	}
	x, err := l.TryAcquire(ctx, LeaseParams{Name: cmp.Or(p.Name, MaintenanceLeaseName), Holder: p.Holder, TTL: p.TTL, ClockOffset: p.ClockOffset})
	if err != nil {
		return nil, err
	}
	return &maintenanceLock{lease: x, purge: purge}, nil
}

// maintenanceLock is idemdriver.MaintenanceLock on a lease.
type maintenanceLock struct {
	lease *Lease
	purge PurgeFunc
}

func (m *maintenanceLock) FencingToken() int64 { return m.lease.Token() }

func (m *maintenanceLock) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	if m.lease.released {
		return 0, idemdriver.ErrLockLost
	}
	return m.purge(ctx, p, m.lease)
}

func (m *maintenanceLock) Refresh(ctx context.Context) error { return m.lease.Refresh(ctx) }
func (m *maintenanceLock) Release(ctx context.Context) error { return m.lease.Release(ctx) }
