package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.TxClaimer = (*Driver)(nil)

// ClaimTx implements idemdriver.TxClaimer: the one-commit mode's claim. It
// reads first, outside any transaction, as Claim does: a record that cannot
// be claimed is answered from that read (one statement; WAL readers never
// wait for the writer). Otherwise it begins the transaction (BEGIN
// IMMEDIATE: it waits for SQLite's single write lock, which a one-commit
// execution of any key holds until it commits, up to BusyTimeout as every
// transaction does; wait is not used and ErrLockWait never returned: a
// bound for one key's wait would refuse other keys' requests, which queue
// for the same lock) and runs the claim's upsert in it; when
// the upsert loses (the record changed between the read and BEGIN), the
// record is read again under the write lock and answered. Statements of a
// first execution: the read, BEGIN and the upsert.
func (d *Driver) ClaimTx(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	if err := d.prepare(ctx); err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	args := claimArgs(p)
	read, answer, err := d.readClaim(ctx, p, args)
	switch {
	case err != nil:
		return idemdriver.ClaimResult{}, nil, err
	case answer:
		return idemdriver.ClaimResult{Record: *read}, nil, nil
	}

	// BEGIN IMMEDIATE waits for the write lock as every transaction does
	// (BusyTimeout): the lock is the database's, not the key's, so a bound
	// of one key's wait would refuse other keys' requests under load.
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	// Nothing of the claim was written when it did not win: the rollback
	// only gives the write lock up, and a failed one leaves nothing behind.
	end := func() { _ = tx.Rollback() }
	rec, err := scanRecord(tx.StmtContext(ctx, d.stmts.claim).QueryRowContext(ctx, args...), nil)
	if err == nil {
		stmt := d.stmts.complete
		return claimed(read, rec), &idemsql.SQLTx{Tx: tx,
			CompleteIn: func(ctx context.Context, tx *sql.Tx, p idemdriver.CompleteParams) (bool, error) {
				return complete(ctx, tx.StmtContext(ctx, stmt), p)
			}}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		end()
		return idemdriver.ClaimResult{}, nil, err
	}
	// The upsert did not claim: under the write lock, the record read now
	// is the one it lost to.
	var expired bool
	lost, err := scanRecord(tx.StmtContext(ctx, d.stmts.claimRead).QueryRowContext(ctx, args...), &expired)
	end()
	if err != nil {
		return idemdriver.ClaimResult{}, nil, err
	}
	return idemdriver.ClaimResult{Record: lost}, nil, nil
}
