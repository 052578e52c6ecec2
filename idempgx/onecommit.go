package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.TxClaimer = (*Driver)(nil)

// ClaimTx implements idemdriver.TxClaimer: the one-commit mode's claim. On
// a plain table its first statements come in the order Claim's do
// (ClaimOrder). Read first (readSQL, no transaction): a record that may not
// be claimed is the answer, one statement. The claim itself is one round
// trip: a pgx batch that begins the transaction (pgx's Batch.BeginTx) and
// runs the claim, uncommitted, on a connection the driver acquired (see
// claimTx): insertBoundedSQL when the read found no record (or came
// second), the claim statement (claimBoundedSQL) when it found one that may
// be claimed or the INSERT met a record written since. INSERT first: that
// batch with insertBoundedSQL before any read; a key it meets is rolled
// back and read, and answered as above. Both statements also bound the
// transaction's lock waits (lock_timeout, local to the transaction); on a
// partitioned table (no read first) the bound is a set_config of its own,
// followed by the key's transaction-scoped advisory lock and
// claimPartitionedSQL. A concurrent claim of the key (an INSERT, or the
// partitioned claim's advisory lock) waits for this transaction to end;
// past wait it fails with 55P03 lock_not_available, reported as
// idemdriver.ErrLockWait. Statements of a new key: BEGIN and the INSERT,
// after the read when it comes first; a claim that does not win in the
// transaction adds a ROLLBACK.
func (d *Driver) ClaimTx(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	if err := claimTextable(p); err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	args := readArgs(p)
	waitMS := max(wait.Milliseconds(), 1)
	// fresh: the claim is a plain INSERT (the INSERT first, or the read
	// found no record); insertFirst: it comes before any read.
	fresh, insertFirst := false, false
	if d.part == nil {
		if d.order.readFirst() {
			// Read first, as Claim: a record that may not be claimed is the
			// answer, with no transaction.
			res, claimable, found, err := d.claimRead(ctx, p, args)
			switch {
			case err != nil && !retryable(err):
				return idemdriver.ClaimResult{}, nil, unstorable(err)
			case err == nil && found:
				d.order.met(true)
				if !claimable {
					return res, nil, nil
				}
			}
			fresh = err == nil && !found
		} else {
			fresh, insertFirst = true, true
		}
	}
	d.fullArgs(&args, p)
	var lastErr error
	for try := 0; try < maxClaimTries; try++ {
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			return idemdriver.ClaimResult{}, nil, err
		}
		res, tx, err := d.claimIn(ctx, conn, p, args, waitMS, fresh)
		if err == nil && res.Claimed {
			if fresh {
				d.order.met(false)
			}
			return res, tx.business(d), nil
		}
		// Nothing was written: a rollback ends the read (a detached context:
		// the connection must go back to the pool idle).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return res, nil, nil
		case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
			return idemdriver.ClaimResult{}, nil, fmt.Errorf("idempgx: %w (%s): %w", idemdriver.ErrLockWait, time.Duration(waitMS)*time.Millisecond, err)
		case errors.Is(err, errKeyWritten):
			d.order.met(true)
			fresh, lastErr = false, err // claimBoundedSQL decides
			if insertFirst {
				// The key exists: its read is the answer when the record
				// may not be claimed, with no transaction, as in the
				// read-first order.
				insertFirst = false
				res, claimable, found, err := d.claimRead(ctx, p, args)
				switch {
				case err != nil && !retryable(err):
					return idemdriver.ClaimResult{}, nil, unstorable(err)
				case err == nil && found && !claimable:
					return res, nil, nil
				}
				fresh = err == nil && !found // removed since the INSERT
			}
		case retryable(err), errors.Is(err, errClaimRaced):
			lastErr = err
		default:
			return idemdriver.ClaimResult{}, nil, unstorable(err)
		}
	}
	return idemdriver.ClaimResult{}, nil, fmt.Errorf("idempgx: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

// claimIn begins a transaction on conn and runs the claim in it, all in one
// batch (see ClaimTx): the answer, and the transaction, open even when the
// claim failed (the caller rolls it back; that also gives conn back). The
// error is errClaimRaced when the statement lost a race to a row its
// snapshot could not see (see claimSQL; the caller runs it again in a new
// transaction).
//
// With fresh (the read found no record), the claim is insertBoundedSQL, and
// the error errKeyWritten when the key was written since the read.
func (d *Driver) claimIn(ctx context.Context, conn *pgxpool.Conn, p idemdriver.ClaimParams, args []any, waitMS int64, fresh bool) (res idemdriver.ClaimResult, tx *claimTx, err error) {
	b := newBatch()
	b.BeginTx(pgx.TxOptions{})
	wait := strconv.FormatInt(waitMS, 10)
	switch {
	case fresh:
		b.queue(d.q(insertBoundedSQL), append(args, wait)...)
	case d.part != nil:
		// The bound must come before the key's advisory lock, a statement
		// of its own.
		b.queue(setLockTimeoutSQL, wait)
		b.queue(lockKeySQL, args[0], args[1]) // scope, key: claimArgs's first two
		b.queue(d.q(claimPartitionedSQL), args...)
	default:
		b.queue(d.q(claimBoundedSQL), append(args, wait)...)
	}
	br := conn.SendBatch(ctx, &b.Batch)
	tx = newClaimTx(conn, br.Tx())
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			return res, tx, err
		}
	}
	if fresh {
		var inserted bool
		res, inserted, err = scanInserted(br.QueryRow(), p)
		if err == nil && !inserted {
			err = errKeyWritten
		}
		return res, tx, err
	}
	rows, err := br.Query()
	if err != nil {
		return res, tx, err
	}
	res, found, err := scanClaim(rows)
	if err == nil && !found {
		err = errClaimRaced
	}
	return res, tx, err
}

// errKeyWritten is claimIn's error when insertBoundedSQL met a record
// written since the read (the caller claims again with claimBoundedSQL).
var errKeyWritten = errors.New("idempgx: the key was written since the claim's read")

// setLockTimeoutSQL bounds the transaction's lock waits (milliseconds, as
// text): SET LOCAL with a parameter, which a batch can carry.
const setLockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`
