package idem

import (
	"errors"
	"fmt"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// Sentinel errors, each one problem type (docs/problems.md).
var (
	// ErrMissingKey: no Idempotency-Key; 400.
	ErrMissingKey = errors.New("idem: missing Idempotency-Key")
	// ErrInvalidKey: a malformed, repeated or oversize key; 400.
	ErrInvalidKey = errors.New("idem: invalid Idempotency-Key")
	// ErrMissingScope: Config.Scope returned an error or ""; 401.
	ErrMissingScope = errors.New("idem: no scope for this request")
	// ErrScopeUnstorable: a scope no store can hold; 500.
	ErrScopeUnstorable = errors.New("idem: the request's scope cannot be stored")
	// ErrPathTooLong: a path longer than MaxPathLength; 414.
	ErrPathTooLong = errors.New("idem: request path too long")
	// ErrRequestTooLarge: a body over MaxRequestBytes; 413.
	ErrRequestTooLarge = errors.New("idem: request body too large")
	// ErrBodyUnreadable: a body not read to its end; 400.
	ErrBodyUnreadable = errors.New("idem: request body could not be read")
	// ErrKeyReused: the key was first used for another request; 422.
	ErrKeyReused = errors.New("idem: Idempotency-Key reused with a different request")
	// ErrInFlight: another execution owns the key; 409.
	ErrInFlight = errors.New("idem: a request with this Idempotency-Key is in flight")
	// ErrLeaseLost: the execution was fenced out; 409.
	ErrLeaseLost = errors.New("idem: lease lost to another worker")
	// ErrResponseNotStored: the response exceeded MaxResponseBytes; 410.
	ErrResponseNotStored = errors.New("idem: the response of this key was not stored")
	// ErrResponseMissing: a SUCCEEDED record holds no response, or one
	// damaged in the store (idemsql.DecodeResponse); 500.
	ErrResponseMissing = errors.New("idem: the key's record succeeded but holds no response")
	// ErrRecordDamaged: the key's record cannot be a valid one (PROCESSING
	// without a lease bound, idemdriver.DecisionDamaged); 500, never run.
	ErrRecordDamaged = errors.New("idem: the key's record is damaged (PROCESSING without a lease bound)")
	// ErrInvalidStatus: the handler's final status was outside 200-599; idem
	// answered 500 in its place and recorded that answer, replayed to every
	// retry.
	ErrInvalidStatus = errors.New("idem: the handler answered a status outside 200-599")
	// ErrTxAborted: the claim's transaction aborted; a 2xx is answered 500.
	ErrTxAborted = idemdriver.ErrTxAborted
	// ErrSealKeyMissing: a SUCCEEDED record is sealed with a key id that
	// EngineConfig.SealKeys does not list; 500, never run again.
	ErrSealKeyMissing = seal.ErrKeyMissing
	// ErrSealBroken: a SUCCEEDED record's sealed response or seal tag does
	// not authenticate (altered, emptied, or copied from another record); or
	// the record is plain and ReplayPlain unset; 500, never run again.
	ErrSealBroken = seal.ErrBroken
	// ErrNoExecution is returned outside a protected execution.
	ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the work behind idem's middleware or Engine.Do, with an Idempotency-Key, and is this its context, such as r.Context() or c.Request.Context() with gin?)")
	// ErrExecutionEnded is returned after the execution ended.
	ErrExecutionEnded = errors.New("idem: the execution has ended; its transaction is closed")
	// ErrOverloaded: EngineConfig.MaxInFlight executions were in flight;
	// refused before the claim, nothing claimed or run; 503.
	ErrOverloaded = errors.New("idem: too many executions in flight; refused before its claim")
	// ErrStoreUnavailable: the store did not answer; 503.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrExecutionTimeout is the context cause past MaxExecution.
	ErrExecutionTimeout = errors.New("idem: the execution ran past MaxExecution")
)

// StoreError is a failed store operation; it matches ErrStoreUnavailable.
type StoreError struct {
	Op  string // claim, heartbeat, complete, fail, release, begin, commit
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("idem: store %s: %v", e.Op, e.Err) }

// Unwrap returns the driver's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports true for ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }
