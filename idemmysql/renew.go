package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Renewer = (*Driver)(nil)

// renewBatch is the most leases one renewal statement carries (4
// placeholders each, far below MySQL's 65,535): a longer list is sent as
// several statements.
const renewBatch = 1000

// renewIdle closes the renewal connection (Open's renewal pool) after this
// long without a renewal.
const renewIdle = time.Minute

// renewFence is one lease's condition in the renewal statements: the
// fence of the fenced writes (scope, key, fencing token, created_at), which
// MySQL resolves through the primary key as a union of point ranges. Args:
// scope, key, token, created_at (µs).
const renewFence = "(scope = ? AND `key` = ? AND fencing_token = ? AND created_at = " + at + ")"

// renewSQL is the renewal of n leases: Heartbeat's UPDATE with the fences
// of every lease ORed. Args: offset, lease, offset, then renewFence's of
// each lease.
func renewSQL(n int) string {
	return `UPDATE idem_keys SET locked_until = ` + clock + ` + INTERVAL ? MICROSECOND, ` + touch +
		` WHERE ` + processing + ` AND (` + fences(n) + `)`
}

// renewedSQL reads which of n leases are owned (PROCESSING, their fence
// matching), after a renewal that did not renew them all. Args: renewFence's
// of each lease.
func renewedSQL(n int) string {
	return "SELECT scope, `key`, fencing_token, " + micros(`created_at`) +
		` FROM idem_keys WHERE ` + processing + ` AND (` + fences(n) + `)`
}

// processing is state = 'PROCESSING' in a form no index matches: with
// statistics that know of few PROCESSING records, MySQL otherwise reads
// the renewals' rows through idem_keys_processing (state, locked_until),
// every record in flight, and not the primary key
// (TestStatementsUsePrimaryKey).
const processing = "CONCAT(state, '') = 'PROCESSING'"

func fences(n int) string { return strings.Repeat(renewFence+" OR ", n-1) + renewFence }

// renewOpen is the pool Renew runs on when Open made the driver: one
// connection of its own, on the same connector as the driver's pool, so
// renewals never wait behind a burst of claims and business transactions
// for a pooled connection.
func renewOpen(dc driver.Connector) *sql.DB {
	db := sql.OpenDB(dc)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(renewIdle)
	db.SetConnMaxLifetime(DefaultConnMaxLifetime)
	return db
}

// Renew implements idemdriver.Renewer: one UPDATE per renewBatch leases,
// each row fenced as Heartbeat's; every lease is renewed when the UPDATE
// changed as many rows as it was sent leases (a fenced write always changes
// its row: see "Fenced writes" in the package documentation), and
// otherwise a read of the fences tells which (the rows it did not renew
// cannot be renewed since, the ones it renewed stay owned). A driver from
// Open renews on a connection of its own (closed after a minute without
// renewal); one from New on its pool. A deadlock or a certification
// failure (Galera) runs the statement again.
func (d *Driver) Renew(ctx context.Context, p idemdriver.RenewParams) ([]bool, error) {
	renewed := make([]bool, len(p.Leases))
	db := d.db
	if d.renewDB != nil {
		db = d.renewDB
	}
	off := p.ClockOffset.Microseconds()
	for lo := 0; lo < len(p.Leases); lo += renewBatch {
		leases := p.Leases[lo:min(lo+renewBatch, len(p.Leases))]
		fenceArgs := make([]any, 0, 4*len(leases))
		for _, l := range leases {
			fenceArgs = append(fenceArgs, l.Scope, l.Key, l.FencingToken, l.CreatedAt.UnixMicro())
		}
		n, err := renewExec(ctx, db, renewSQL(len(leases)), append([]any{off, p.LeaseDuration.Microseconds(), off}, fenceArgs...))
		if err != nil {
			return nil, err
		}
		if n == int64(len(leases)) {
			for i := range leases {
				renewed[lo+i] = true
			}
			continue
		}
		if err := renewedRead(ctx, db, leases, fenceArgs, renewed[lo:]); err != nil {
			return nil, err
		}
	}
	return renewed, nil
}

// renewExec runs the renewal, again after a deadlock or a changed row, and
// returns the rows it changed.
func renewExec(ctx context.Context, db *sql.DB, query string, args []any) (int64, error) {
	for try := 1; ; try++ {
		res, err := db.ExecContext(ctx, query, args...)
		if err == nil {
			return res.RowsAffected()
		}
		if k := classify(err); (k == kindDeadlock || k == kindChanged) && try < maxClaimTries && ctx.Err() == nil {
			if err := sleepJitter(ctx); err != nil {
				return 0, err
			}
			continue
		}
		return 0, err
	}
}

// renewedRead sets renewed[i] for each of leases still owned (its fence
// matching a PROCESSING row); fenceArgs are renewedSQL's arguments.
func renewedRead(ctx context.Context, db *sql.DB, leases []idemdriver.FenceParams, fenceArgs []any, renewed []bool) error {
	type fence struct {
		scope, key     string
		token, created int64
	}
	rows, err := db.QueryContext(ctx, renewedSQL(len(leases)), fenceArgs...)
	if err != nil {
		return err
	}
	defer func() { _ = rows.Close() }() // read to the end below; Err reports what Close would
	owned := map[fence]bool{}
	for rows.Next() {
		var f fence
		if err := rows.Scan(&f.scope, &f.key, &f.token, &f.created); err != nil {
			return err
		}
		owned[f] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i, l := range leases {
		renewed[i] = owned[fence{l.Scope, l.Key, l.FencingToken, l.CreatedAt.UnixMicro()}]
	}
	return nil
}
