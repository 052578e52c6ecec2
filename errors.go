package idem

import (
	"errors"
	"fmt"

	"github.com/idemgo/idem/idemdriver"
)

// Sentinel errors, one per kind of answer. Each maps to one problem type
// (ProblemFor, docs/problems.md); branch on them with errors.Is.
var (
	// ErrMissingKey is the kind of a protected request without an
	// Idempotency-Key header: 400, problem type missing-key.
	ErrMissingKey = errors.New("idem: missing Idempotency-Key")
	// ErrInvalidKey is the kind of a malformed, repeated or oversize
	// Idempotency-Key header (ParseKey): 400, problem type invalid-key.
	ErrInvalidKey = errors.New("idem: invalid Idempotency-Key")
	// ErrMissingScope is the kind of a request whose Config.Scope returned an
	// error or an empty scope: 401, problem type missing-scope.
	ErrMissingScope = errors.New("idem: no scope for this request")
	// ErrScopeUnstorable is the kind of a request whose Config.Scope returned
	// a scope no store can hold (longer than MaxScopeLength, not valid UTF-8,
	// a NUL byte), or one the store refused (idemdriver.ErrUnstorable): a
	// server fault that no retry cures, answered 500 with the problem type
	// scope-unstorable and logged. The handler does not run.
	ErrScopeUnstorable = errors.New("idem: the request's scope cannot be stored")
	// ErrPathTooLong is the kind of a protected request whose escaped path
	// is longer than MaxPathLength: 414, problem type path-too-long.
	ErrPathTooLong = errors.New("idem: request path too long")
	// ErrRequestTooLarge is the kind of a request whose body exceeds
	// Config.MaxRequestBytes: 413, problem type request-too-large.
	ErrRequestTooLarge = errors.New("idem: request body too large")
	// ErrBodyUnreadable is the kind of a request whose body could not be
	// read to its end (the client stopped sending): 400, problem type
	// body-unreadable. Nothing was claimed.
	ErrBodyUnreadable = errors.New("idem: request body could not be read")
	// ErrKeyReused is the kind of a request whose key was first used with
	// another method, path or payload: 422, problem type key-reused.
	ErrKeyReused = errors.New("idem: Idempotency-Key reused with a different request")
	// ErrInFlight is the kind of a request whose key another execution owns
	// under a live lease: 409 with Retry-After, problem type
	// request-in-flight.
	ErrInFlight = errors.New("idem: a request with this Idempotency-Key is in flight")
	// ErrLeaseLost is the kind of an execution whose lease ran out and whose
	// key another worker claimed (it was fenced out, so its outcome was not
	// recorded): 409 to its caller, problem type request-in-flight.
	ErrLeaseLost = errors.New("idem: lease lost to another worker")
	// ErrResponseNotStored is the kind of a replay whose response exceeded
	// Config.MaxResponseBytes and was not stored: 410, problem type
	// response-not-stored.
	ErrResponseNotStored = errors.New("idem: the response of this key was not stored")
	// ErrResponseMissing is the kind of a replay whose record says
	// SUCCEEDED but holds no response (a record damaged by hand, a partial
	// restore): 500, problem type response-missing. The handler is not run
	// again; an operator may release the key.
	ErrResponseMissing = errors.New("idem: the key's record succeeded but holds no response")
	// ErrTxAborted is the kind of an execution whose claim's transaction
	// had aborted before its completion (a statement in it failed; the
	// drivers wrap it, as idemdriver.ErrTxAborted): its writes are gone. A
	// 2xx answered then is a handler bug: recorded FAILED (the retry runs
	// again), answered 500 transaction-aborted, and logged.
	ErrTxAborted = idemdriver.ErrTxAborted
	// ErrNoExecution is returned by Tx, RelayKey and ReleaseKey outside a
	// protected execution. With gin, pass c.Request.Context(), not the
	// *gin.Context (or use adapters/idemgin's helpers).
	ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the work behind idem's middleware or Engine.Do, with an Idempotency-Key, and is this its context, such as r.Context() or c.Request.Context() with gin?)")
	// ErrExecutionEnded is returned by Tx and ReleaseKey after the execution
	// ended (from a goroutine that outlived the handler, say).
	ErrExecutionEnded = errors.New("idem: the execution has ended; its transaction is closed")
	// ErrStoreUnavailable is the kind of a request the store could not
	// answer for: 503 with Retry-After, problem type store-unavailable. The
	// handler does not run unprotected.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrExecutionTimeout is the cause of a handler's context cancelled
	// after Config.MaxExecution; the lease is no longer renewed.
	ErrExecutionTimeout = errors.New("idem: the execution ran past MaxExecution")
)

// StoreError wraps an error from the store with the operation that failed.
// errors.Is(err, ErrStoreUnavailable) is true for every StoreError; Unwrap
// returns the driver's error (a *pgconn.PgError, a sqlite error, ...).
type StoreError struct {
	Op  string // claim, heartbeat, complete, fail, release, begin, commit
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("idem: store %s: %v", e.Op, e.Err) }

// Unwrap returns the driver's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports true for ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }
