package protocol

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// The errors the protocol answers with. The root package re-exports each
// under the same name (idem.ErrInFlight is ErrInFlight), where their
// documentation is.
var (
	ErrMissingKey       = errors.New("idem: missing Idempotency-Key")
	ErrInvalidKey       = errors.New("idem: invalid Idempotency-Key")
	ErrKeyReused        = errors.New("idem: Idempotency-Key reused with a different request")
	ErrInFlight         = errors.New("idem: a request with this Idempotency-Key is in flight")
	ErrLeaseLost        = errors.New("idem: lease lost to another worker")
	ErrResponseMissing  = errors.New("idem: the key's record succeeded but holds no response")
	ErrRecordDamaged    = errors.New("idem: the key's record is damaged (PROCESSING without a lease bound)")
	ErrScopeUnstorable  = errors.New("idem: the request's scope cannot be stored")
	ErrExecutionEnded   = errors.New("idem: the execution has ended; its transaction is closed")
	ErrOverloaded       = errors.New("idem: too many executions in flight; refused before its claim")
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	ErrExecutionTimeout = errors.New("idem: the execution ran past Lease.MaxExecution")
	ErrCommitPending    = errors.New("idem: the commit of the outcome did not return within CompleteTimeout; it was not cancelled and may still take effect")
	ErrTxAborted        = idemdriver.ErrTxAborted
	ErrSealKeyMissing   = seal.ErrKeyMissing
	ErrSealBroken       = seal.ErrBroken
	ErrOutcomeUnknown   = errors.New("idem: the outcome of this request cannot be known; it is held for an operator")

	// The errors of steps (docs/contract.md section 11).
	ErrStepNotAllowed        = errors.New("idem: steps are not allowed here")
	ErrStepRepeated          = errors.New("idem: a step name met twice in one execution")
	ErrStepName              = errors.New("idem: invalid step name")
	ErrStepStarted           = errors.New("idem: a step of this execution has started; its key cannot be released")
	ErrStepNotRecorded       = errors.New("idem: the step ran but its result could not be recorded")
	ErrStepUnreconciled      = errors.New("idem: an at-most-once step's earlier start is not reconciled yet")
	ErrStepResultUndecodable = errors.New("idem: the step's recorded result does not decode into its type")
	// ErrFnFailed is the Err of a job that returned OverrideFailed.
	ErrFnFailed = errors.New("idem: fn failed")
)

// StoreError is a failed store operation; it matches ErrStoreUnavailable.
type StoreError struct {
	Op  string // claim, heartbeat, complete, fail, release, begin, commit, step, finish step, steps
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("idem: store %s: %v", e.Op, e.Err) }

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }

// InFlightError is ErrInFlight with the delay after which a retry may find
// the outcome.
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("idem: another execution with this key is in flight; retry after %s", e.RetryAfter)
}

// Is reports whether target is ErrInFlight.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// keyReusedError is the error of a 422 (ErrKeyReused), its message made
// only when it is read: an HTTP 422 sends a problem, and never reads it.
type keyReusedError struct {
	method, path string
	sameOp       bool // the same method and path (or maybe: another case, another escaping), another payload
}

// NewKeySafe is false when the key was first used for the same method and
// path with another payload: perhaps this very request, its bytes changed
// between attempts (idem.NewKeySafe reads it).
func (e *keyReusedError) NewKeySafe() bool { return !e.sameOp }

// KeysSent marks err, an ErrInvalidKey, as that of a request that sent more
// than one key (a header repeated or a list), as a client does that adds the
// header again on each retry: its first attempt may have run under one of
// them, so a new key is not safe (idem.NewKeySafe reads it).
func KeysSent(err error) error { return keysSentError{err} }

type keysSentError struct{ error }

func (e keysSentError) Unwrap() error    { return e.error }
func (e keysSentError) NewKeySafe() bool { return false }

func (e *keyReusedError) Error() string {
	return fmt.Sprintf("%s: the key was first used for %s %q with another payload or operation", ErrKeyReused, e.method, e.path)
}

// Unwrap returns ErrKeyReused.
func (e *keyReusedError) Unwrap() error { return ErrKeyReused }

// UnknownError is ErrOutcomeUnknown as this execution made it: the step
// whose outcome cannot be known and why (an idemdriver Reason constant).
type UnknownError struct {
	Step   string
	Reason string
	Err    error // what made it so: fn's or the reconcile function's error, or a decoding error; may be nil
}

func (e *UnknownError) Error() string {
	msg := fmt.Sprintf("%s: step %q: %s", ErrOutcomeUnknown, e.Step, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrOutcomeUnknown.
func (e *UnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// Unwrap returns the cause.
func (e *UnknownError) Unwrap() error { return e.Err }
