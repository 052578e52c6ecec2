package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.CompleteCommitter = businessTx{}

// Begin implements idemdriver.Driver (READ COMMITTED, the default): BEGIN,
// one round trip, on a connection the driver acquires from the pool (see
// claimTx).
func (d *Driver) Begin(ctx context.Context) (idemdriver.Tx, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		conn.Release()
		return nil, err
	}
	return businessTx{newClaimTx(conn, tx), d}, nil
}

// businessTx is the claim's business transaction on PostgreSQL.
type businessTx struct {
	tx *claimTx
	d  *Driver
}

// Complete writes the completion in the transaction. A transaction that a
// failed statement of the handler aborted answers 25P02
// (in_failed_sql_transaction), reported as idemdriver.ErrTxAborted; one the
// handler ended itself, as idemdriver.ErrTxDone.
func (t businessTx) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	ok, err := t.d.complete(ctx, t.tx, p)
	return ok, txErr(err)
}

// CompleteCommit implements idemdriver.CompleteCommitter: the completion
// (completeOrRaiseSQL) and the COMMIT in one pipeline, one round trip. When
// the completion fails or is fenced out, the server skips the COMMIT (every
// message after an error up to the pipeline's Sync is skipped, as is the
// rest of a multi-statement query in the simple protocol), so nothing is
// committed and the transaction waits, aborted, for Rollback.
func (t businessTx) CompleteCommit(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	if t.tx.done.Load() {
		return false, txErr(pgx.ErrTxClosed)
	}
	args, err := completeArgs(p)
	if err != nil {
		return false, err
	}
	b := newBatch()
	b.queue(t.d.q(completeOrRaiseSQL), args...)
	b.queue("commit")
	br := t.tx.Tx.SendBatch(ctx, &b.Batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // the same error, or a later one of the skipped COMMIT
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, fencedOutMarker) {
			return false, nil
		}
		return false, txErr(unstorable(err))
	}
	tag, err := br.Exec()
	err = errors.Join(err, br.Close())
	t.tx.end()
	switch {
	case err != nil:
		return false, fmt.Errorf("idempgx: %w: %w", idemdriver.ErrCommit, err)
	case tag.String() != "COMMIT":
		return false, fmt.Errorf("idempgx: %w: the server answered %q", idemdriver.ErrCommit, tag.String())
	}
	return true, nil
}

func (t businessTx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t businessTx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}
func (t businessTx) Native() any { return t.tx }

// txErr reports the errors of a completion in the business transaction as
// the seam names them: a transaction the handler ended (pgx.ErrTxClosed) as
// idemdriver.ErrTxDone, one a failed statement aborted (25P02) as
// idemdriver.ErrTxAborted.
func txErr(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrTxClosed):
		return fmt.Errorf("%w: %w", idemdriver.ErrTxDone, err)
	case errors.As(err, &pgErr) && pgErr.Code == "25P02": // in_failed_sql_transaction
		return fmt.Errorf("%w: %w", idemdriver.ErrTxAborted, err)
	}
	return err
}

// batch is a pgx.Batch of at most len(qs) queries (and one queued by
// Batch.BeginTx) allocated with it: one allocation for the batch, where
// Queue costs one per query and more as the slice grows.
type batch struct {
	pgx.Batch
	qs   [3]pgx.QueuedQuery
	ptrs [4]*pgx.QueuedQuery
	n    int // of qs used
}

func newBatch() *batch {
	b := new(batch)
	b.QueuedQueries = b.ptrs[:0]
	return b
}

// queue is pgx.Batch.Queue in b's own storage.
func (b *batch) queue(sql string, args ...any) {
	q := &b.qs[b.n]
	b.n++
	q.SQL, q.Arguments = sql, args
	b.QueuedQueries = append(b.QueuedQueries, q)
}

// claimTx is the pgx.Tx a protected handler gets (Tx): pgx's transaction on
// a connection the driver acquired from the pool itself. idem can then
// commit it in the pipeline of the completion (businessTx.CompleteCommit)
// and put the connection back at once; a pgxpool.Tx would need a COMMIT of
// its own, one more round trip, before it gave the connection back. Once
// the transaction has ended, by idem or by the handler, every method
// returns pgx.ErrTxClosed, as pgx's own do; so do those of its savepoints
// (Begin).
type claimTx struct {
	pgx.Tx
	conn *pgxpool.Conn // nil on a savepoint
	// done is shared by a transaction and its savepoints: set when the
	// transaction has ended and its connection went back to the pool. It
	// points at the transaction's ended.
	done  *atomic.Bool
	ended atomic.Bool
}

func newClaimTx(conn *pgxpool.Conn, tx pgx.Tx) *claimTx {
	t := &claimTx{Tx: tx, conn: conn}
	t.done = &t.ended
	return t
}

// end marks the transaction over and gives its connection back to the pool
// (which closes it unless it is idle, outside any transaction).
func (t *claimTx) end() {
	if t.done.Swap(true) {
		return
	}
	t.conn.Release()
}

func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.done.Load() {
		return nil, pgx.ErrTxClosed
	}
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &claimTx{Tx: sp, done: t.done}, nil
}

// Commit commits the transaction (a savepoint: releases it). The
// transaction's connection goes back to the pool whatever the outcome.
func (t *claimTx) Commit(ctx context.Context) error {
	if t.done.Load() {
		return pgx.ErrTxClosed
	}
	err := t.Tx.Commit(ctx)
	if t.conn != nil {
		t.end()
	}
	return err
}

// Rollback rolls the transaction back (a savepoint: rolls back to it). The
// transaction's connection goes back to the pool whatever the outcome.
func (t *claimTx) Rollback(ctx context.Context) error {
	if t.done.Load() {
		return pgx.ErrTxClosed
	}
	err := t.Tx.Rollback(ctx)
	if t.conn != nil {
		t.end()
	}
	return err
}

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return t.live().CopyFrom(ctx, table, columns, rows)
}
func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.live().SendBatch(ctx, b)
}
func (t *claimTx) LargeObjects() pgx.LargeObjects { return t.live().LargeObjects() }
func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.live().Prepare(ctx, name, sql)
}
func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.live().Exec(ctx, sql, args...)
}
func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.live().Query(ctx, sql, args...)
}
func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.live().QueryRow(ctx, sql, args...)
}

// live is the transaction to run a statement in: pgx's, or ended once the
// transaction is over.
func (t *claimTx) live() pgx.Tx {
	if t.done.Load() {
		return ended
	}
	return t.Tx
}

// ended is a pgx transaction that has ended: every method returns an error
// matching pgx.ErrTxClosed (the transaction of a batch that failed before
// it began, as pgx.FailedBatchResults documents).
var ended = func() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}()
