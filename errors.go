package idem

import (
	"errors"
	"fmt"
)

// Sentinel errors, one per kind of answer. Each maps to one problem type
// (see Problem and docs/problems.md); branch on them with errors.Is.
var (
	// ErrMissingKey: a protected request without Idempotency-Key (400).
	ErrMissingKey = errors.New("idem: missing Idempotency-Key")
	// ErrInvalidKey: a malformed, repeated or oversize key (400).
	ErrInvalidKey = errors.New("idem: invalid Idempotency-Key")
	// ErrMissingScope: the Scope function returned an error (401).
	ErrMissingScope = errors.New("idem: no scope for this request")
	// ErrRequestTooLarge: the body exceeds MaxRequestBytes (413).
	ErrRequestTooLarge = errors.New("idem: request body too large")
	// ErrKeyReused: the key was used with another method, path or payload (422).
	ErrKeyReused = errors.New("idem: Idempotency-Key reused with a different request")
	// ErrInFlight: another execution owns the key under a live lease (409).
	ErrInFlight = errors.New("idem: a request with this Idempotency-Key is in flight")
	// ErrLeaseLost: this worker's lease ran out and another worker claimed the
	// key (fenced out); its completion was refused (409 to its caller).
	ErrLeaseLost = errors.New("idem: lease lost to another worker")
	// ErrResponseNotStored: the key's response exceeded MaxResponseBytes and
	// cannot be replayed (410).
	ErrResponseNotStored = errors.New("idem: the response of this key was not stored")
	// ErrStoreUnavailable: the store could not answer (503); the handler
	// does not run.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrExecutionTimeout is the cause of a handler's context cancelled
	// after Config.MaxExecution; the lease is no longer renewed.
	ErrExecutionTimeout = errors.New("idem: the execution ran past MaxExecution")
)

// StoreError wraps an error from the store with the operation that failed.
// errors.Is(err, ErrStoreUnavailable) is true for every StoreError; Unwrap
// returns the driver's error (a *pgconn.PgError, a sqlite error, ...).
type StoreError struct {
	Op  string // claim, heartbeat, complete, fail, begin, commit
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("idem: store %s: %v", e.Op, e.Err) }

// Unwrap returns the driver's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports true for ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }
