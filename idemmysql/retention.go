package idemmysql

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Maintainable = (*Driver)(nil)

// purgeable is the condition of a record that a purge may delete: expired
// for longer than OlderThan, and not a PROCESSING record under a live lease.
// Args: offset, older, offset (µs; see purgeArgs). UTC_TIMESTAMP is
// evaluated once per statement, so both nows are the same.
const purgeable = `expires_at <= ` + now + ` - INTERVAL ? MICROSECOND
	AND NOT (state = 'PROCESSING' AND locked_until > ` + now + `)`

// purgeSelectSQL selects and locks one batch: it walks the expires_at index
// from the oldest record and locks at most limit rows, skipping the rows that
// another transaction holds (FOR UPDATE SKIP LOCKED, MySQL 8.0.1+ and
// MariaDB 10.6+): the purge never waits for a request, and a request waits
// for the purge at most until its batch commits. Under READ COMMITTED a
// locking read evaluates the condition on the row's latest committed version
// and takes no gap locks, so a record re-claimed meanwhile is left alone and
// new claims are never blocked by the range scanned. Args: purgeArgs, limit.
var purgeSelectSQL = "SELECT scope, `key` FROM idem_keys WHERE " + purgeable + `
ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`

var countExpiredSQL = `SELECT COUNT(*) FROM idem_keys WHERE ` + purgeable

func purgeArgs(p idemdriver.PurgeParams) []any {
	off := p.ClockOffset.Microseconds()
	return []any{off, max(p.OlderThan, 0).Microseconds(), off}
}

// purgeDeleteRows bounds the keys named by one DELETE of a purge batch: a
// batch of more records is deleted by several DELETEs in its transaction.
// 1000 keys of the longest size (2 x 255 bytes) make a statement of about
// 1 MiB, well within max_allowed_packet.
const purgeDeleteRows = 1000

// txBeginner is a *sql.DB or a *sql.Conn.
type txBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// PurgeExpired implements idemdriver.Purger. One batch is one short
// READ COMMITTED transaction on a pool connection: START TRANSACTION; a
// SELECT ... FOR UPDATE SKIP LOCKED of at most p.Limit expired records
// (purgeSelectSQL); a DELETE of those records by primary key (one per
// purgeDeleteRows; none when nothing was selected); COMMIT. MySQL's DELETE
// has neither SKIP LOCKED nor a way to take its rows from a locking
// subquery on the same table, hence the two statements.
func (d *Driver) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	return d.purge(ctx, d.db, p)
}

func (d *Driver) purge(ctx context.Context, db txBeginner, p idemdriver.PurgeParams) (int64, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idemmysql: purge: Limit %d must be positive", p.Limit)
	}
	n, err := d.purgeBatch(ctx, db, p, nil)
	if err != nil {
		return 0, fmt.Errorf("idemmysql: purge: %w", err)
	}
	return n, nil
}

// purgeBatch runs one batch; under the maintenance lock (lease not nil) the
// transaction first renews the lease (Lease.FenceTx), which keeps its row
// locked, and certified on Galera, until COMMIT.
func (d *Driver) purgeBatch(ctx context.Context, db txBeginner, p idemdriver.PurgeParams, lease *idemmigrate.Lease) (int64, error) {
	sel, err := d.stmt(ctx, stPurgeSelect)
	if err != nil {
		return 0, err
	}
	// READ COMMITTED (see Begin): no gap locks on the expires_at range.
	tx, err := db.BeginTx(ctx, d.beginOpts)
	if err != nil {
		return 0, err
	}
	// After Commit a no-op (sql.ErrTxDone). After a failure, that failure is
	// the batch's error; a rollback that fails on the wire marks the
	// connection bad, and the pool drops it.
	defer func() { _ = tx.Rollback() }()
	if lease != nil {
		if err := lease.FenceTx(ctx, tx); err != nil {
			return 0, err
		}
	}
	rows, err := tx.StmtContext(ctx, sel).QueryContext(ctx, append(purgeArgs(p), p.Limit)...)
	if err != nil {
		return 0, err
	}
	keys, err := idemsql.CollectRows(rows, func(rows *sql.Rows) (k [2][]byte, err error) {
		return k, rows.Scan(&k[0], &k[1])
	})
	if err != nil {
		return 0, err
	}
	var n int64
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), purgeDeleteRows)]
		keys = keys[len(chunk):]
		res, err := tx.ExecContext(ctx, deleteKeysSQL(chunk))
		if err != nil {
			return 0, err
		}
		m, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		n += m
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return n, nil
}

// deleteKeysSQL deletes the records of keys, which the transaction has
// locked, through the primary key. The keys are written as hexadecimal
// literals (X'...'), which carry bytes and nothing else: the statement is
// sent as text in one round trip, without a prepared statement per batch
// size or the 65,535-placeholder limit.
func deleteKeysSQL(keys [][2][]byte) string {
	var b strings.Builder
	b.WriteString("DELETE FROM idem_keys WHERE (scope, `key`) IN (")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(X'")
		b.WriteString(hex.EncodeToString(k[0]))
		b.WriteString("',X'")
		b.WriteString(hex.EncodeToString(k[1]))
		b.WriteString("')")
	}
	b.WriteByte(')')
	return b.String()
}

// CountExpired implements idemdriver.Purger with one SELECT COUNT(*) of
// the purgeable records.
func (d *Driver) CountExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	var n int64
	if err := d.db.QueryRowContext(ctx, countExpiredSQL, purgeArgs(p)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemmysql: count expired: %w", err)
	}
	return n, nil
}

// TryLockMaintenance implements idemdriver.MaintenanceLocker with the lease
// "maintainer" in idem_locks (idemmigrate.Leases): a row written with the
// database's clock, replicated to every node of a Galera cluster (where
// GET_LOCK would be local to one node), held by no connection. It lasts
// p.TTL from each take or Refresh; a holder that dies is replaced once it
// has run out. Every batch of the lock's PurgeExpired renews the lease
// first, in the batch's transaction (see purgeBatch), so a holder whose
// lease was taken over deletes nothing.
func (d *Driver) TryLockMaintenance(ctx context.Context, p idemdriver.LockParams) (idemdriver.MaintenanceLock, error) {
	l, err := d.leases.TryLockMaintenance(ctx, p, func(ctx context.Context, p idemdriver.PurgeParams, lease *idemmigrate.Lease) (int64, error) {
		if p.Limit <= 0 {
			return 0, fmt.Errorf("idemmysql: purge: Limit %d must be positive", p.Limit)
		}
		n, err := d.purgeBatch(ctx, d.db, p, lease)
		switch {
		case err == nil, errors.Is(err, idemdriver.ErrLockLost):
		case classify(err) == kindDeadlock:
			// On Galera, a take-over of the lease on another node fails this
			// batch's COMMIT at certification (1213): the lease is lost.
			err = fmt.Errorf("idemmysql: purge: %w: %v", idemdriver.ErrLockLost, err)
		default:
			err = fmt.Errorf("idemmysql: purge: %w", err)
		}
		return n, err
	})
	if err != nil && !errors.Is(err, idemdriver.ErrLockHeld) {
		err = fmt.Errorf("idemmysql: maintenance lock: %w", err)
	}
	return l, err
}

// Now implements idemdriver.Inspector: UTC_TIMESTAMP(6) plus offset.
func (d *Driver) Now(ctx context.Context, offset time.Duration) (time.Time, error) {
	var us int64
	if err := d.db.QueryRowContext(ctx, `SELECT `+micros(now), offset.Microseconds()).Scan(&us); err != nil {
		return time.Time{}, err
	}
	return idemsql.MicrosTime(us), nil
}

// statsSQL counts in one pass (a full scan of idem_keys). Args: offset x 3.
var statsSQL = `SELECT ` + micros(now) + `, COUNT(*),
	COUNT(CASE WHEN state = 'PROCESSING' THEN 1 END), COUNT(CASE WHEN state = 'SUCCEEDED' THEN 1 END),
	COUNT(CASE WHEN state = 'FAILED' THEN 1 END), ` + micros(`MIN(created_at)`) + `,
	COUNT(CASE WHEN expires_at <= ` + now + ` THEN 1 END),
	COUNT(CASE WHEN state = 'PROCESSING' AND locked_until <= ` + now + ` THEN 1 END),
	COUNT(CASE WHEN state = 'PROCESSING' AND locked_until IS NULL THEN 1 END)
FROM idem_keys`

// Stats implements idemdriver.Inspector: two aggregate reads (a full scan
// of idem_keys each) in one REPEATABLE READ, read-only transaction, so that
// both read one snapshot and the totals and the top scopes agree.
func (d *Driver) Stats(ctx context.Context, p idemdriver.StatsParams) (idemdriver.Stats, error) {
	st := idemdriver.Stats{ByState: map[idemdriver.State]int64{}}
	tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return st, err
	}
	defer func() { _ = tx.Rollback() }() // read only: nothing to undo
	off := p.ClockOffset.Microseconds()
	return idemsql.QueryStats(ctx, tx, statsSQL, []any{off, off, off}, `SELECT scope, COUNT(*) FROM idem_keys GROUP BY scope
		ORDER BY COUNT(*) DESC, scope LIMIT ?`, p.TopScopes)
}

// stuckSQL reads a range of the index idem_keys_processing (state,
// locked_until): its NULLs (the damaged records, first: MySQL sorts NULL
// first) and up to now. Args: offset, limit.
var stuckSQL = `SELECT ` + micros(`n.now`) + `, ` + recordColumns + `
FROM ` + nowTable + `
JOIN idem_keys AS k ON k.state = 'PROCESSING' AND (k.locked_until IS NULL OR k.locked_until <= n.now)
ORDER BY k.locked_until LIMIT ?`

// Stuck implements idemdriver.Inspector with a range read of the index on
// (state, locked_until).
func (d *Driver) Stuck(ctx context.Context, p idemdriver.StuckParams) ([]idemdriver.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idemmysql: stuck: Limit %d must be positive", p.Limit)
	}
	rows, err := d.db.QueryContext(ctx, stuckSQL, p.ClockOffset.Microseconds(), p.Limit)
	if err != nil {
		return nil, err
	}
	return idemsql.CollectRows(rows, func(rows *sql.Rows) (idemdriver.StuckRecord, error) {
		s, err := scanSnapshot(rows)
		st := idemdriver.StuckRecord{Record: s.rec}
		if s.lockedUS.Valid {
			st.Overdue = time.Duration(s.nowUS-s.lockedUS.Int64) * time.Microsecond
		}
		return st, err
	})
}

// MigrationStatus implements idemdriver.Migrator with idemmigrate: goose's
// status of the embedded migrations, read under the migration lease (so it
// waits for a migration in progress), each applied one's missing tables
// named. AppliedAt is goose's record of the time, in UTC (see
// versionStore).
func (d *Driver) MigrationStatus(ctx context.Context) ([]idemdriver.Migration, error) {
	m, err := d.embedded(ctx)
	if err != nil {
		return nil, err
	}
	return m.Status(ctx)
}

// MigrateDown implements idemdriver.Migrator, under the migration lease.
// Rolling back 00001_idem_keys.sql drops idem_keys (DROP TABLE commits at
// once: there is no undo).
func (d *Driver) MigrateDown(ctx context.Context) (idemdriver.Migration, error) {
	m, err := d.embedded(ctx)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	return m.Down(ctx)
}

// MigrateDownDroppingRecords is MigrateDown without its refusal
// (idemdriver.ErrDropsRecords): the records or steps the rollback drops
// are lost.
func (d *Driver) MigrateDownDroppingRecords(ctx context.Context) (idemdriver.Migration, error) {
	m, err := d.embedded(ctx)
	if err != nil {
		return idemdriver.Migration{}, err
	}
	return m.DownDroppingRecords(ctx)
}

// listSQL reads one page of records in primary-key order, each filter off
// when its parameter is empty. Args: offset, state twice, scope twice, key
// twice, after scope, after key, limit.
var listSQL = `SELECT ` + micros(`n.now`) + `, ` + recordColumns + `, k.request
FROM ` + nowTable + `
JOIN idem_keys AS k ON (? = '' OR k.state = ?) AND (? = '' OR k.scope = ?) AND (? = '' OR k.` + "`key`" + ` = ?)
	AND (k.scope, k.` + "`key`" + `) > (?, ?)
ORDER BY k.scope, k.` + "`key`" + ` LIMIT ?`

// List implements idemdriver.Lister.
func (d *Driver) List(ctx context.Context, p idemdriver.ListParams) ([]idemdriver.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("idemmysql: list: Limit %d must be positive", p.Limit)
	}
	state := string(p.State)
	rows, err := d.db.QueryContext(ctx, listSQL, p.ClockOffset.Microseconds(), state, state, p.Scope, p.Scope,
		p.Key, p.Key, p.AfterScope, p.AfterKey, p.Limit)
	if err != nil {
		return nil, err
	}
	return idemsql.CollectRows(rows, func(rows *sql.Rows) (idemdriver.Record, error) {
		s, err := scanWithRequest(rows)
		return s.rec, err
	})
}

// removeSQL: args scope, key, token, created_at (µs), state.
var removeSQL = "DELETE FROM idem_keys WHERE scope = ? AND `key` = ? AND fencing_token = ? AND created_at = " + at + " AND state = ?"

// Remove implements idemdriver.Remover.
func (d *Driver) Remove(ctx context.Context, p idemdriver.RemoveParams) (bool, error) {
	res, err := d.db.ExecContext(ctx, removeSQL, p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro(), string(p.State))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}
