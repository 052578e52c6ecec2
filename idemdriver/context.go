package idemdriver

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/idemgo/idem/internal/execctx"
)

// ErrNoExecution is returned by TxFromContext and NativeTx when the context
// does not belong to a handler that idem is running under a claim.
var ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the handler behind idem's middleware, with an Idempotency-Key?)")

// ErrTxDone is wrapped by Tx.Complete when the handler committed or rolled
// back the claim's transaction itself: the completion could not ride in it.
var ErrTxDone = errors.New("idem: the claim's transaction was already committed or rolled back by the handler")

// ErrTxAborted is wrapped by Tx.Complete when the claim's transaction had
// aborted before the completion (PostgreSQL: a statement of the handler
// failed, SQLSTATE 25P02 "current transaction is aborted"): nothing more can
// be written in it and its business writes are gone. The core then rolls it
// back and records the handler's answer on its own; a 2xx answer is a
// handler bug, recorded FAILED (CONTRACT section 6).
var ErrTxAborted = errors.New("idem: the claim's transaction had aborted before its completion")

// txSource is what the core puts in a protected handler's context: the
// claim's business transaction, begun on first use.
type txSource interface {
	Tx(ctx context.Context) (Tx, error)
}

// TxFromContext returns the claim's business transaction, beginning it on
// first use (the completion is written in it and committed with it), or
// ErrNoExecution when ctx is not a protected handler's. Its other errors
// are the core's (the execution has ended, the store could not begin).
func TxFromContext(ctx context.Context) (Tx, error) {
	s, ok := execctx.From(ctx).(txSource)
	if !ok {
		return nil, ErrNoExecution
	}
	return s.Tx(ctx)
}

// NativeTx returns the claim's business transaction as the driver's own
// type T (pgx.Tx for idempgx, *sql.Tx for idemsqlite and idemmysql): the
// typed form of TxFromContext, on which each driver's Tx function is built.
// It returns TxFromContext's errors, and an error naming both types when
// the store's transaction is not a T (the handler asks idempgx.Tx for a
// transaction of an SQLite store, for example).
func NativeTx[T any](ctx context.Context) (T, error) {
	var zero T
	tx, err := TxFromContext(ctx)
	if err != nil {
		return zero, err
	}
	native, ok := tx.Native().(T)
	if !ok {
		return zero, fmt.Errorf("idemdriver: the store's transaction is a %T, not a %v: the handler asks another driver's Tx than its store's", tx.Native(), reflect.TypeFor[T]())
	}
	return native, nil
}
