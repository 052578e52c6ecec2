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

var _ idemdriver.CompleteCommitter = (*businessTx)(nil)

// Begin implements idemdriver.Driver (READ COMMITTED, the default) on a
// connection the driver acquires from the pool, sending BEGIN with the
// transaction's first statement (see claimTx).
//
// A protected handler gets this transaction with
// idem.Tx[pgx.Tx](r.Context()), beginning it on first use. Do the business
// writes in it and leave Commit and Rollback to idem: the completion is
// written in the same transaction, fenced by the token, and committed with
// it (CONTRACT section 6).
//
// Its BEGIN goes with its first statement (in one pipeline when that is an
// Exec), and the completion goes with its COMMIT (one pipeline): a first
// execution that writes in the claim's transaction is the claim, the
// handler's statements and one more round trip. Once idem has committed or
// rolled it back, every method returns pgx.ErrTxClosed: a goroutine the
// handler left behind cannot write on a connection that went back to the
// pool.
//
// A statement of the handler that fails (a unique violation it answers 409
// for, say) aborts the whole transaction in PostgreSQL: its writes are gone
// and nothing more can be written in it. idem then rolls it back and records
// the handler's answer on its own, so a 409 is replayed; a 2xx after such a
// failure would claim writes that never happened, and is answered 500
// (problem type transaction-aborted) and recorded FAILED.
func (d *Driver) Begin(ctx context.Context) (idemdriver.Tx, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return newClaimTx(conn, nil).business(d), nil
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
func (t *businessTx) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	ok, err := t.d.complete(ctx, t.tx, p)
	return ok, txErr(err)
}

// CompleteCommit implements idemdriver.CompleteCommitter: the completion
// (completeOrRaiseSQL) and the COMMIT in one pipeline, one round trip (with
// BEGIN first when the handler sent no statement). When the completion
// fails or is fenced out, the server skips the COMMIT (every
// message after an error up to the pipeline's Sync is skipped, as is the
// rest of a multi-statement query in the simple protocol), so nothing is
// committed and the transaction waits, aborted, for Rollback. An error that
// is not the server's answer (a connection lost once the pipeline went
// out) leaves the COMMIT's fate unknown: it wraps idemdriver.ErrCommit, as
// a failed COMMIT does.
func (t *businessTx) CompleteCommit(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	if t.tx.done.Load() {
		return false, txErr(pgx.ErrTxClosed)
	}
	args, err := completeArgs(p)
	if err != nil {
		return false, err
	}
	b := newBatch()
	deferred := t.tx.Tx == nil // no statement yet: BEGIN goes first
	if deferred {
		b.BeginTx(pgx.TxOptions{})
	}
	q, args := notifying(p.FenceParams, completeOrRaiseStatements, args)
	b.queue(t.d.q(q), args...)
	b.queue("commit")
	br := t.tx.conn.SendBatch(ctx, &b.Batch)
	if deferred {
		_, err = br.Exec()
		t.tx.Tx = br.Tx()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err != nil {
		_ = br.Close() // the same error, or a later one of the skipped COMMIT
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			// Not the server's answer (the connection broke, say): the
			// COMMIT may have reached the server and run. The connection
			// is closed, unless idle, as it goes back to the pool.
			t.tx.end()
			return false, fmt.Errorf("idempgx: %w (outcome unknown): %w", idemdriver.ErrCommit, err)
		}
		if pgErr.Code == "22P02" && strings.Contains(pgErr.Message, fencedOutMarker) {
			return false, nil
		}
		return false, txErr(unstorable(err))
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	t.tx.end()
	switch {
	case err != nil:
		return false, fmt.Errorf("idempgx: %w: %w", idemdriver.ErrCommit, err)
	case tag.String() != "COMMIT":
		return false, fmt.Errorf("idempgx: %w: the server answered %q", idemdriver.ErrCommit, tag.String())
	}
	return true, nil
}

func (t *businessTx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t *businessTx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}
func (t *businessTx) Native() any { return t.tx }

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
// a connection the driver acquired from the pool itself, so that idem can
// commit it in the pipeline of the completion (businessTx.CompleteCommit)
// and put the connection back at once (a pgxpool.Tx would need a COMMIT of
// its own, one more round trip, before it gave the connection back).
//
// Begin defers BEGIN to the transaction's first statement: an Exec sends
// both in one pipeline (pgx's Batch.BeginTx), any other first use sends
// BEGIN first, as pgx.Conn.BeginTx does. Once the transaction has ended, by
// idem or by the handler, every method returns pgx.ErrTxClosed, as pgx's
// own do, and Conn returns nil; so do those of its savepoints (Begin). Like
// pgx's, it is not safe for concurrent use: a goroutine the handler leaves
// behind must not race idem's completion.
type claimTx struct {
	// Tx is pgx's transaction; nil until BEGIN is sent (see begun).
	pgx.Tx
	conn *pgxpool.Conn // nil on a savepoint
	// done is shared by a transaction and its savepoints: set when the
	// transaction has ended and its connection went back to the pool. It
	// points at the transaction's ended.
	done  *atomic.Bool
	ended atomic.Bool
	// biz is idem's view of the transaction (see business), allocated
	// with it.
	biz businessTx
}

// business is t as the seam's transaction, for d.
func (t *claimTx) business(d *Driver) *businessTx {
	t.biz = businessTx{t, d}
	return &t.biz
}

// newClaimTx is a claimTx on conn: tx, or, when tx is nil, one whose BEGIN
// is deferred.
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

// begun is the transaction to run a statement in: pgx's, begun now when
// BEGIN was deferred; ended once the transaction is over.
func (t *claimTx) begun(ctx context.Context) (pgx.Tx, error) {
	switch {
	case t.done.Load():
		return ended, nil
	case t.Tx != nil:
		return t.Tx, nil
	}
	tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, err
	}
	t.Tx = tx
	return tx, nil
}

// beginWith sends the deferred BEGIN and the statement sql in one pipeline.
// When BEGIN itself fails, BEGIN stays deferred: the next statement tries
// again, and a completion reports the connection's error, not a closed
// transaction.
func (t *claimTx) beginWith(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	b := newBatch()
	b.BeginTx(pgx.TxOptions{})
	b.queue(sql, args...)
	br := t.conn.SendBatch(ctx, &b.Batch)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		t.Tx = br.Tx()
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// execModeGiven reports whether the leading arguments of an Exec name a
// pgx.QueryExecMode, which a batch cannot carry (only a QueryRewriter).
func execModeGiven(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode:
			return true
		case pgx.QueryRewriter:
			continue
		}
		return false
	}
	return false
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.Tx == nil && !t.done.Load() && !execModeGiven(args) {
		return t.beginWith(ctx, sql, args)
	}
	tx, err := t.begun(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		rows, _ := ended.Query(ctx, sql) // rows that report an error, for the rows, _ := tx.Query(...) idiom
		return rows, err
	}
	return tx.Query(ctx, sql, args...)
}

func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := t.begun(ctx)
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := t.begun(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.SendBatch(ctx, b)
}

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, rows)
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// LargeObjects is pgx's; it sends a deferred BEGIN first (pgx gives it no
// context: it is sent without a deadline).
func (t *claimTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.begun(context.Background())
	if err != nil {
		return ended.LargeObjects()
	}
	return tx.LargeObjects()
}

// Conn is the connection the transaction runs on, its deferred BEGIN sent
// first (without a deadline: pgx gives Conn no context), so that a statement
// sent on it runs in the transaction; nil once the transaction has ended
// (the connection went back to the pool, and belongs to another request).
func (t *claimTx) Conn() *pgx.Conn {
	tx, err := t.begun(context.Background())
	if err != nil || t.done.Load() {
		return nil
	}
	return tx.Conn()
}

// Begin starts a savepoint (pgx's pseudo nested transaction).
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &claimTx{Tx: sp, done: t.done}, nil
}

// Commit commits the transaction (a savepoint: releases it); one never
// begun has nothing to commit. The transaction's connection goes back to
// the pool whatever the outcome.
func (t *claimTx) Commit(ctx context.Context) error {
	return t.finish(ctx, pgx.Tx.Commit)
}

// Rollback rolls the transaction back (a savepoint: rolls back to it); one
// never begun has nothing to roll back. The transaction's connection goes
// back to the pool whatever the outcome.
func (t *claimTx) Rollback(ctx context.Context) error {
	return t.finish(ctx, pgx.Tx.Rollback)
}

func (t *claimTx) finish(ctx context.Context, f func(pgx.Tx, context.Context) error) error {
	if t.done.Load() {
		return pgx.ErrTxClosed
	}
	var err error
	if t.Tx != nil {
		err = f(t.Tx, ctx)
	}
	if t.conn != nil {
		t.end()
	}
	return err
}

// ended is a pgx transaction that has ended: every method returns an error
// matching pgx.ErrTxClosed (the transaction of a batch that failed before
// it began, as pgx.FailedBatchResults documents).
var ended = func() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}()

// errRow is the row of a query whose transaction could not begin.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
