package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.TxClaimer = (*Driver)(nil)

// ClaimTx implements idemdriver.TxClaimer: the one-commit mode's claim.
// The transaction begins with its lock wait bounded (BEGIN; SET LOCAL
// lock_timeout, one round trip in the simple protocol), then runs the claim
// statement of Claim (claimSQL; on a partitioned table the key's
// transaction-scoped advisory lock and claimPartitionedSQL) in it,
// uncommitted. A concurrent claim of the key (an INSERT ... ON CONFLICT, or
// the partitioned claim's advisory lock) waits for this transaction to end;
// past wait it fails with 55P03 lock_not_available, reported as
// idemdriver.ErrLockWait. Statements: BEGIN and the claim (two on a
// partitioned table); a claim that does not win adds a ROLLBACK.
func (d *Driver) ClaimTx(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	if err := claimTextable(p); err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	args := claimArgs(p)
	opts := pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL lock_timeout = " + strconv.FormatInt(max(wait.Milliseconds(), 1), 10)}
	var lastErr error
	for try := 0; try < maxClaimTries; try++ {
		tx, err := d.pool.BeginTx(ctx, opts)
		if err != nil {
			return idemdriver.ClaimResult{}, nil, err
		}
		res, err := d.claimIn(ctx, tx, args)
		if err == nil && res.Claimed {
			return res, businessTx{tx, d}, nil
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
			return idemdriver.ClaimResult{}, nil, fmt.Errorf("idempgx: %w (%s): %w", idemdriver.ErrLockWait, time.Duration(max(wait.Milliseconds(), 1))*time.Millisecond, err)
		case retryable(err), errors.Is(err, errClaimRaced):
			lastErr = err
		default:
			return idemdriver.ClaimResult{}, nil, unstorable(err)
		}
	}
	return idemdriver.ClaimResult{}, nil, fmt.Errorf("idempgx: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

// claimIn runs the claim statement in tx: one row, or errClaimRaced when
// the statement lost a race to a row its snapshot could not see (see
// claimSQL; the caller runs it again in a new transaction).
func (d *Driver) claimIn(ctx context.Context, tx pgx.Tx, args []any) (res idemdriver.ClaimResult, err error) {
	query := d.q(claimSQL)
	if d.part != nil {
		if _, err := tx.Exec(ctx, d.q(lockKeySQL), args[0], args[1]); err != nil {
			return res, err
		}
		query = d.q(claimPartitionedSQL)
	}
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return res, err
	}
	res, found, err := scanClaim(rows)
	if err == nil && !found {
		err = errClaimRaced
	}
	return res, err
}
