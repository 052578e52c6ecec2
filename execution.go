package idem

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/idemgo/idem/internal/protocol"
)

// Execution describes the claim a handler (or Do's fn) runs under.
type Execution struct {
	Scope string
	// Key is the client's key, also when EngineOptions.Sealing.KeyHashSecret stores
	// its hash (Engine.StoredKey) instead.
	Key string
	// FencingToken exceeds every earlier claim's of (Scope, Key) while its record exists.
	FencingToken int64
	// Attempt counts the claims of this key, this one included.
	Attempt int
	// Created is the record's created_at (database clock, microseconds), kept by
	// takeovers and re-claims; part of the relayed key (DeriveKey).
	Created time.Time
}

// ExecutionFromContext returns ctx's claim, or false outside one.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return Execution{}, false
	}
	i := e.Info()
	return Execution{Scope: i.Scope, Key: i.Key, FencingToken: i.FencingToken, Attempt: i.Attempt, Created: i.Created}, true
}

// Tx returns the claim's transaction as the store's type T: pgx.Tx or
// *sql.Tx (CONTRACT section 6). It is begun on first use on the execution's
// context and commits with the completion: leave Commit and Rollback to idem.
// Errors: ErrNoExecution, ErrExecutionEnded, a *StoreError, or a type mismatch.
func Tx[T any](ctx context.Context) (T, error) {
	var zero T
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return zero, ErrNoExecution
	}
	tx, err := e.Tx()
	if err != nil {
		return zero, err
	}
	native, ok := tx.Native().(T)
	if !ok {
		return zero, fmt.Errorf("idem: the store's transaction is a %T, not a %v: ask Tx for the Store's own type", tx.Native(), reflect.TypeFor[T]())
	}
	return native, nil
}

// ReleaseKey asks that the execution under ctx not be recorded: its record is
// removed, its writes rolled back, and the next request with the key runs as
// new. Call it before any side effect. Errors: ErrNoExecution, ErrExecutionEnded,
// ErrStepStarted (a step of the record's life started, in this execution or
// an earlier one: docs/contract.md section 11.2), a *StoreError (the steps
// could not be read; nothing is released). On a store that keeps steps it
// reads them: one statement.
func ReleaseKey(ctx context.Context) error {
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return ErrNoExecution
	}
	return e.Release()
}
