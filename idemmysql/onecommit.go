package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
// a first execution: BEGIN, the read and the INSERT (or UPDATE); on a
// MariaDB Galera node also SET autocommit = 0 after them and SET autocommit
// = 1 once the transaction has ended (galeraTx).
//
// On Galera the row lock is local to a node: a claim of the key on another
// node runs too, and the later COMMIT loses certification, or the earlier
// one's write set aborts the later transaction (a brute-force abort). The
// transaction's completion and COMMIT report that 1213 wrapping
// idemdriver.ErrConflict; the handler's statements return it as they get it
// (or, now and then, not at all: see galeraTx).
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
		tx, g, err := d.beginOneCommit(ctx)
		if err != nil {
			return idemdriver.ClaimResult{}, nil, err
		}
		res, won, err := d.claimIn(ctx, tx, p, offset, wait)
		if err == nil && won && g != nil {
			err = g.autocommitOff(ctx)
			won = err == nil
		}
		if err == nil && won {
			t := d.sqlTx(tx)
			if g != nil {
				t.Ended = g.end
			}
			return res, t, nil
		}
		_ = tx.Rollback()
		g.end()
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

// autocommitRestore bounds the statement that turns a one-commit
// connection's autocommit back on (see galeraTx).
const autocommitRestore = 5 * time.Second

// galeraTx is a one-commit transaction on a MariaDB Galera node, on a
// connection of its own whose autocommit is turned off once the claim is
// won, until the transaction has ended.
//
// A transaction that another node's commit aborts (a brute-force abort)
// does not always say so: in 3 to 6 of 100 such aborts in the galera
// topology (MariaDB 10.11, Galera 26.4) no statement returned 1213, and
// the statements after the abort ran in autocommit, each committed at once:
// the business writes of a handler whose claim had lost its key. With
// autocommit off they open a new transaction instead; the fenced completion
// then finds no claim of this transaction (the abort rolled its row back),
// and the core rolls back, business writes included
// (TestGaleraOneCommitHandlerStatementLosesToAnotherNode). The claim's own
// write cannot commit so: an aborted claim's INSERT meets the winner's row
// (1062), its compare-and-set the winner's token.
type galeraTx struct {
	conn *sql.Conn
	tx   *sql.Tx
	off  atomic.Bool // autocommit is off: end turns it back on
	once sync.Once
	stop func() bool // ends the context's call of end
}

// beginOneCommit begins a one-commit transaction: on a MariaDB Galera node
// on a connection of its own (g), elsewhere from the pool (g nil).
func (d *Driver) beginOneCommit(ctx context.Context) (tx *sql.Tx, g *galeraTx, err error) {
	prefix, err := d.leasePrefix(ctx) // not empty on a MariaDB Galera node
	if err != nil {
		return nil, nil, err
	}
	if prefix == "" {
		tx, err := d.db.BeginTx(ctx, d.beginOpts)
		return tx, nil, err
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	if tx, err = conn.BeginTx(ctx, d.beginOpts); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	g = &galeraTx{conn: conn, tx: tx}
	// The core always ends the claim's context: the connection goes back
	// then at the latest (a handler may end the transaction itself).
	g.stop = context.AfterFunc(ctx, g.end)
	return tx, g, nil
}

// autocommitOff turns the won claim's session autocommit off, in the
// transaction (which SET autocommit = 0 does not commit).
func (g *galeraTx) autocommitOff(ctx context.Context) error {
	g.off.Store(true)
	_, err := g.tx.ExecContext(ctx, `SET autocommit = 0`)
	return err
}

// end releases the transaction's connection once it has ended (more than
// one call is harmless): anything still open is rolled back first (SET
// autocommit = 1 would commit it), then autocommit turned back on; a
// connection that does not answer that is discarded, so none goes back to
// the pool with autocommit off. A nil g is a pooled transaction: nothing
// to do.
func (g *galeraTx) end() {
	if g == nil {
		return
	}
	g.once.Do(func() {
		g.stop()
		_ = g.tx.Rollback() // a no-op once committed or rolled back
		if g.off.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), autocommitRestore)
			defer cancel()
			if _, err := g.conn.ExecContext(ctx, `SET autocommit = 1`); err != nil {
				_ = g.conn.Raw(func(any) error { return driver.ErrBadConn }) // discarded, not pooled
			}
		}
		_ = g.conn.Close()
	})
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
