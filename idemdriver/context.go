package idemdriver

import (
	"context"
	"errors"
)

// ErrNoExecution is returned by TxFromContext when the context does not
// belong to a handler that idem is running under a claim.
var ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the handler behind idem's middleware, with an Idempotency-Key?)")

// ErrTxDone is wrapped by Tx.Complete when the handler committed or rolled
// back the claim's transaction itself: the completion could not ride in it.
var ErrTxDone = errors.New("idem: the claim's transaction was already committed or rolled back by the handler")

// TxSource hands a protected handler the claim's business transaction. The
// core puts one in the handler's context; driver packages turn it into their
// native transaction type (idempgx.Tx returns a pgx.Tx, idemsqlite.Tx a *sql.Tx).
type TxSource interface {
	// Tx begins the business transaction on first use and returns the same
	// one on later calls. The completion is written in it and committed with it.
	Tx(ctx context.Context) (Tx, error)
}

type txSourceKey struct{}

// WithTxSource returns ctx carrying s. Used by the core.
func WithTxSource(ctx context.Context, s TxSource) context.Context {
	return context.WithValue(ctx, txSourceKey{}, s)
}

// TxFromContext returns the claim's business transaction, beginning it on
// first use, or ErrNoExecution when ctx has none.
func TxFromContext(ctx context.Context) (Tx, error) {
	s, ok := ctx.Value(txSourceKey{}).(TxSource)
	if !ok {
		return nil, ErrNoExecution
	}
	return s.Tx(ctx)
}
