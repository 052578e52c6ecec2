package idemsqlite

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Renewer = (*Driver)(nil)

// renewBatch is the most leases one renewal statement carries (4
// parameters each, far below SQLite's 32,766).
const renewBatch = 1000

// renewSQL renews n leases in one write: heartbeatSQL's UPDATE for every
// row whose fence (scope, key, fencing token, created_at, PROCESSING) is
// one of the leases listed, found through the primary key. It returns the
// fence of each row it renewed. Args: scope, key, token and created_at (µs)
// of each lease, then the clock offset and the lease (µs), numbered after
// them (a plain ? takes the number after the largest one used before it).
func renewSQL(n int) string {
	offset, lease := strconv.Itoa(4*n+1), strconv.Itoa(4*n+2)
	clock := `(CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?` + offset + `)` // now, positional
	return `WITH f(scope, key, token, created) AS (VALUES ` + strings.Repeat("(?, ?, ?, ?), ", n-1) + `(?, ?, ?, ?))
UPDATE idem_keys SET locked_until = ` + clock + ` + ?` + lease + `, updated_at = ` + clock + `
WHERE state = 'PROCESSING' AND (scope, key, fencing_token, created_at) IN (SELECT scope, key, token, created FROM f)
RETURNING scope, key, fencing_token, created_at`
}

// Renew implements idemdriver.Renewer: one write of renewSQL per
// renewBatch leases, where Heartbeat takes SQLite's one write lock once per
// lease. The pool is database/sql's, without a bound, so a renewal waits
// for the write lock, never for a connection; one that waited for it until
// ctx's deadline returns an error wrapping idemdriver.ErrBusy, as Heartbeat
// does.
func (d *Driver) Renew(ctx context.Context, p idemdriver.RenewParams) ([]bool, error) {
	renewed := make([]bool, len(p.Leases))
	type fence struct {
		scope, key     string
		token, created int64
	}
	for lo := 0; lo < len(p.Leases); lo += renewBatch {
		leases := p.Leases[lo:min(lo+renewBatch, len(p.Leases))]
		args := make([]any, 0, 4*len(leases)+2)
		for _, l := range leases {
			args = append(args, l.Scope, l.Key, l.FencingToken, l.CreatedAt.UnixMicro())
		}
		args = append(args, p.ClockOffset.Microseconds(), p.LeaseDuration.Microseconds())
		owned := map[fence]bool{}
		err := retryBusy(ctx, func() error {
			clear(owned)
			rows, err := d.db.QueryContext(ctx, renewSQL(len(leases)), args...)
			if err != nil {
				return err
			}
			defer func() { _ = rows.Close() }() // read to the end below; Err reports what Close would
			for rows.Next() {
				var f fence
				if err := rows.Scan(&f.scope, &f.key, &f.token, &f.created); err != nil {
					return err
				}
				owned[f] = true
			}
			return rows.Err()
		})
		if err != nil {
			if queued(ctx, err) {
				err = fmt.Errorf("idemsqlite: renewal queued behind another transaction: %w: %w", idemdriver.ErrBusy, err)
			}
			return nil, err
		}
		for i, l := range leases {
			renewed[lo+i] = owned[fence{l.Scope, l.Key, l.FencingToken, l.CreatedAt.UnixMicro()}]
		}
	}
	return renewed, nil
}
