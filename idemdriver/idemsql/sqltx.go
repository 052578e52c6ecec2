package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// SQLTx is the business transaction of a driver on database/sql (idemmysql,
// idemsqlite): a *sql.Tx whose completion the driver writes with Complete.
type SQLTx struct {
	Tx *sql.Tx
	// CompleteIn writes the completion in tx (the driver's fenced statement).
	CompleteIn func(ctx context.Context, tx *sql.Tx, p idemdriver.CompleteParams) (bool, error)
	// Conflict reports the driver's errors by which the database aborted
	// the whole transaction in a conflict with another (MySQL: 1213);
	// Complete and Commit wrap them in idemdriver.ErrConflict. Nil: none.
	Conflict func(error) bool
	// Ended runs after Commit and after Rollback, each time (the driver's
	// cleanup of the transaction's connection). Nil: none.
	Ended func()
}

// Complete implements Tx: a transaction the handler already ended
// (sql.ErrTxDone) is reported as ErrTxDone, a conflict (Conflict) as
// ErrConflict.
func (t *SQLTx) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	ok, err := t.CompleteIn(ctx, t.Tx, p)
	if errors.Is(err, sql.ErrTxDone) {
		err = fmt.Errorf("%w: %w", idemdriver.ErrTxDone, err)
	}
	return ok, t.conflict(err)
}

// Commit implements Tx; a conflict (Conflict) is reported as ErrConflict.
func (t *SQLTx) Commit(context.Context) error {
	err := t.Tx.Commit()
	t.ended()
	return t.conflict(err)
}

func (t *SQLTx) ended() {
	if t.Ended != nil {
		t.Ended()
	}
}

func (t *SQLTx) conflict(err error) error {
	if err != nil && t.Conflict != nil && t.Conflict(err) {
		return fmt.Errorf("%w: %w", idemdriver.ErrConflict, err)
	}
	return err
}

// Rollback implements Tx; a transaction already ended is not an error.
func (t *SQLTx) Rollback(context.Context) error {
	err := t.Tx.Rollback()
	t.ended()
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Native implements Tx: the *sql.Tx.
func (t *SQLTx) Native() any { return t.Tx }

// SQLQueryer is what QueryStats needs of database/sql:
// a *sql.DB, *sql.Conn or *sql.Tx.
type SQLQueryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// QueryStats is Inspector.Stats for a driver on database/sql, run on q (a
// connection or transaction that reads one snapshot). statsQuery, with
// statsArgs, returns one row of (now, total, PROCESSING count, SUCCEEDED
// count, FAILED count, oldest created_at or NULL, expired count, stuck
// count, damaged count), times in microseconds since the Unix epoch; when top > 0,
// topQuery, given top as its one argument, returns the (scope, count) rows
// of the largest scopes (queryScopeCounts). On an error it returns what it
// had read.
func QueryStats(ctx context.Context, q SQLQueryer, statsQuery string, statsArgs []any, topQuery string, top int) (idemdriver.Stats, error) {
	st := idemdriver.Stats{ByState: map[idemdriver.State]int64{}}
	var (
		nowUS, processing, succeeded, failed int64
		oldest                               sql.NullInt64
	)
	err := q.QueryRowContext(ctx, statsQuery, statsArgs...).
		Scan(&nowUS, &st.Total, &processing, &succeeded, &failed, &oldest, &st.Expired, &st.Stuck, &st.Damaged)
	if err != nil {
		return st, err
	}
	st.Now, st.Oldest = MicrosTime(nowUS), NullMicrosTime(oldest)
	st.ByState[idemdriver.StateProcessing], st.ByState[idemdriver.StateSucceeded], st.ByState[idemdriver.StateFailed] = processing, succeeded, failed
	st.ByState[idemdriver.StateUnknown] = st.Total - processing - succeeded - failed // the CHECK allows no other state
	if top > 0 {
		st.TopScopes, err = queryScopeCounts(ctx, q, topQuery, top)
	}
	return st, err
}

// queryScopeCounts runs query on q and reads its rows of (scope, count), in
// the query's order: Stats.TopScopes for a driver on database/sql. It
// returns nil for no rows.
func queryScopeCounts(ctx context.Context, q SQLQueryer, query string, args ...any) ([]idemdriver.ScopeCount, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return CollectRows(rows, func(rows *sql.Rows) (sc idemdriver.ScopeCount, err error) {
		return sc, rows.Scan(&sc.Scope, &sc.Count)
	})
}

// CollectRows reads every row of rows with scan, in order, and closes rows:
// database/sql's counterpart of pgx.CollectRows. It returns nil for no rows;
// on the first error of scan, of the iteration (rows.Err) or of closing
// rows, it returns the rows read before it and that error.
func CollectRows[T any](rows *sql.Rows, scan func(*sql.Rows) (T, error)) (out []T, err error) {
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// CollectRecords reads rows of records that each carry the database's
// now, in microseconds (scan sets it): the records and that now, zero when
// no row came. It closes rows.
func CollectRecords(rows *sql.Rows, scan func(rows *sql.Rows, nowUS *int64) (idemdriver.Record, error)) ([]idemdriver.Record, time.Time, error) {
	var nowUS int64
	recs, err := CollectRows(rows, func(rows *sql.Rows) (idemdriver.Record, error) { return scan(rows, &nowUS) })
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(recs) == 0 {
		return nil, time.Time{}, nil
	}
	return recs, MicrosTime(nowUS), nil
}

// MicrosTime is the UTC time of us, microseconds since the Unix epoch (the
// timestamp columns of idemmysql and idemsqlite).
func MicrosTime(us int64) time.Time { return time.UnixMicro(us).UTC() }

// NullMicrosTime is MicrosTime of a nullable column: nil for NULL.
func NullMicrosTime(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := MicrosTime(v.Int64)
	return &t
}

// InTx runs fn in a transaction of db begun with opts (nil for the
// driver's default), and commits it when fn returns nil. Otherwise it
// rolls back and returns fn's error: after a failed statement the
// transaction is still open, or the server rolled it back, and nothing of
// it commits; a rollback that fails on the wire marks the connection bad,
// and the pool drops it.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Exec runs q in tx and returns the rows it changed.
func Exec(ctx context.Context, tx *sql.Tx, q string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
