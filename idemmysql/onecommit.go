package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.TxClaimer = (*Driver)(nil)

// lockedReadSQL is the claim's read (stRead) as a locking read: in the
// one-commit transaction it takes the key's row lock, or waits for the
// transaction that holds it (another one-commit claim of the key, whose
// row may be an uncommitted INSERT).
var lockedReadSQL = queries[stRead] + ` FOR UPDATE`

// ClaimTx implements idemdriver.TxClaimer: the one-commit mode's claim, in
// a transaction at READ COMMITTED (see Begin). A locking read of the record
// (SELECT ... FOR UPDATE) decides (idemdriver.Decide); a record that cannot
// be claimed is answered, the transaction rolled back; otherwise the INSERT
// or the compare-and-set UPDATE of Claim runs in the transaction,
// uncommitted. A concurrent claim of the key waits for the row lock: the
// locking read, or the INSERT of a key another transaction has inserted and
// not committed, which fails with a duplicate key once that one commits (the
// claim then reads again, in a new transaction). Each of these statements
// waits at most wait: its context ends it (the driver then drops the
// connection; the server ends the wait at innodb_lock_wait_timeout, 1205,
// when that comes first), reported as idemdriver.ErrLockWait. Statements of
// a first execution: BEGIN, the read and the INSERT (or UPDATE).
//
// On Galera the row lock is local to a node: a claim of the key on another
// node runs too, and the later COMMIT loses certification, or the earlier
// one's write set aborts the later transaction (a brute-force abort). The
// transaction's completion and COMMIT report that 1213 wrapping
// idemdriver.ErrConflict; the handler's statements return it as they get it.
func (d *Driver) ClaimTx(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	if err := checkBounds(p); err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	// The claim and the completion need their prepared statements and
	// max_allowed_packet: get them now (once per driver), not from another
	// pooled connection while this transaction holds one and duplicates
	// waiting on the key's lock may hold all the others.
	for _, id := range []stmtID{stInsert, stTakeover, stComplete} {
		if _, err := d.stmt(ctx, id); err != nil {
			return idemdriver.ClaimResult{}, nil, err
		}
	}
	if _, err := d.packetLimit(ctx); err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	offset := p.ClockOffset.Microseconds()
	var lastErr error
	for try := 0; try < maxClaimTries; try++ {
		tx, err := d.db.BeginTx(ctx, d.beginOpts)
		if err != nil {
			return idemdriver.ClaimResult{}, nil, err
		}
		res, won, err := d.claimIn(ctx, tx, p, offset, wait)
		if err == nil && won {
			return res, d.sqlTx(tx), nil
		}
		_ = tx.Rollback()
		k := classify(err)
		switch {
		case err == nil && res.Record.Key != "":
			return res, nil, nil
		case err == nil:
			lastErr = errors.New("idemmysql: the compare-and-set lost to a concurrent write")
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil, k == kindLockWait:
			return idemdriver.ClaimResult{}, nil, fmt.Errorf("idemmysql: %w (%s): %w", idemdriver.ErrLockWait, wait, err)
		case ctx.Err() != nil || k == kindOther:
			return idemdriver.ClaimResult{}, nil, err
		default: // a duplicate key (the other claim committed), a deadlock
			d.noteResolved(k)
			lastErr = err
		}
	}
	return idemdriver.ClaimResult{}, nil, fmt.Errorf("idemmysql: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

// claimIn is one round of ClaimTx in tx: the locking read, then the claim
// when the record read is claimable. won reports a claim; when false with a
// nil error, res.Record is the record the claim lost to (empty when the
// compare-and-set matched no row: try again).
func (d *Driver) claimIn(ctx context.Context, tx *sql.Tx, p idemdriver.ClaimParams, offset int64, wait time.Duration) (res idemdriver.ClaimResult, won bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
	defer cancel()
	snap, err := scanSnapshot(tx.QueryRowContext(wctx, lockedReadSQL, offset, p.Scope, p.Key))
	if err != nil {
		return res, false, err
	}
	dec := decide(snap, p)
	if snap.found && !dec.Claims() {
		return idemdriver.ClaimResult{Record: snap.rec}, false, nil
	}
	if !snap.found {
		res, err = d.insert(wctx, tx, p, snap.nowUS)
		return res, err == nil, err
	}
	return d.takeover(wctx, tx, p, snap, dec.Continues())
}

// txStmt returns statement id, in tx when tx is not nil.
func (d *Driver) txStmt(ctx context.Context, tx *sql.Tx, id stmtID) (*sql.Stmt, error) {
	s, err := d.stmt(ctx, id)
	if err != nil || tx == nil {
		return s, err
	}
	return tx.StmtContext(ctx, s), nil
}
