package idemdriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// SQLTx is the business transaction of a driver on database/sql (idemmysql,
// idemsqlite): a *sql.Tx whose completion the driver writes with Complete.
type SQLTx struct {
	Tx *sql.Tx
	// CompleteIn writes the completion in tx (the driver's fenced statement).
	CompleteIn func(ctx context.Context, tx *sql.Tx, p CompleteParams) (bool, error)
}

// Complete implements Tx: a transaction the handler already ended
// (sql.ErrTxDone) is reported as ErrTxDone.
func (t *SQLTx) Complete(ctx context.Context, p CompleteParams) (bool, error) {
	ok, err := t.CompleteIn(ctx, t.Tx, p)
	if errors.Is(err, sql.ErrTxDone) {
		err = fmt.Errorf("%w: %w", ErrTxDone, err)
	}
	return ok, err
}

// Commit implements Tx.
func (t *SQLTx) Commit(context.Context) error { return t.Tx.Commit() }

// Rollback implements Tx; a transaction already ended is not an error.
func (t *SQLTx) Rollback(context.Context) error {
	if err := t.Tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Native implements Tx: the *sql.Tx.
func (t *SQLTx) Native() any { return t.Tx }
