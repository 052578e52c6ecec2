package idem

import (
	"errors"

	"github.com/idemgo/idem/internal/protocol"
)

// Sentinel errors, each one problem type (docs/problems.md).
var (
	// ErrMissingKey: no Idempotency-Key; 400.
	ErrMissingKey = protocol.ErrMissingKey
	// ErrInvalidKey: a malformed, repeated or oversize key; 400.
	ErrInvalidKey = protocol.ErrInvalidKey
	// ErrMissingScope: Options.Scope returned an error or ""; 401.
	ErrMissingScope = errors.New("idem: no scope for this request")
	// ErrScopeUnstorable: a scope no store can hold; 500.
	ErrScopeUnstorable = protocol.ErrScopeUnstorable
	// ErrPathTooLong: a path longer than MaxPathLength; 414.
	ErrPathTooLong = errors.New("idem: request path too long")
	// ErrRequestTooLarge: a body over Options.Request.MaxBytes; 413.
	ErrRequestTooLarge = errors.New("idem: request body too large")
	// ErrBodyUnreadable: a body not read to its end; 400.
	ErrBodyUnreadable = errors.New("idem: request body could not be read")
	// ErrKeyReused: the key was first used for another request; 422.
	ErrKeyReused = protocol.ErrKeyReused
	// ErrInFlight: another execution owns the key; 409.
	ErrInFlight = protocol.ErrInFlight
	// ErrLeaseLost: the execution was fenced out; 409.
	ErrLeaseLost = protocol.ErrLeaseLost
	// ErrResponseNotStored: the response exceeded
	// EngineOptions.Response.MaxBytes; 410.
	ErrResponseNotStored = errors.New("idem: the response of this key was not stored")
	// ErrResponseMissing: a SUCCEEDED record holds no response, or one
	// damaged in the store (idemsql.DecodeResponse); 500.
	ErrResponseMissing = protocol.ErrResponseMissing
	// ErrRecordDamaged: the key's record cannot be a valid one (PROCESSING
	// without a lease bound, idemdriver.DecisionDamaged); 500, never run.
	ErrRecordDamaged = protocol.ErrRecordDamaged
	// ErrInvalidStatus: the handler's final status was outside 200-599; idem
	// answered 500 in its place and recorded that answer, replayed to every
	// retry.
	ErrInvalidStatus = errors.New("idem: the handler answered a status outside 200-599")
	// ErrTxAborted: the claim's transaction aborted; a 2xx is answered 500.
	ErrTxAborted = protocol.ErrTxAborted
	// ErrSealKeyMissing: a SUCCEEDED record is sealed with a key id that
	// EngineOptions.Sealing.Keys does not list; 500, never run again.
	ErrSealKeyMissing = protocol.ErrSealKeyMissing
	// ErrSealBroken: a SUCCEEDED record's sealed response or seal tag does
	// not authenticate (altered, emptied, or copied from another record); or
	// the record is plain and ReplayPlain unset; 500, never run again.
	ErrSealBroken = protocol.ErrSealBroken
	// ErrNoExecution is returned outside a protected execution.
	ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the work behind idem's middleware or Engine.Do, with an Idempotency-Key, and is this its context, such as r.Context() or c.Request.Context() with gin?)")
	// ErrExecutionEnded is returned after the execution ended.
	ErrExecutionEnded = protocol.ErrExecutionEnded
	// ErrOverloaded: EngineOptions.Admission.MaxInFlight executions were in flight;
	// refused before the claim, nothing claimed or run; 503.
	ErrOverloaded = protocol.ErrOverloaded
	// ErrStoreUnavailable: the store did not answer; 503.
	ErrStoreUnavailable = protocol.ErrStoreUnavailable
	// ErrExecutionTimeout is the context cause past MaxExecution.
	ErrExecutionTimeout = protocol.ErrExecutionTimeout

	// The errors of Step (docs/contract.md section 11).
	// ErrStepNotAllowed: Step cannot run here, before fn ran: in one-commit
	// mode, on SQLite once the claim's transaction was begun (idem.Tx), or
	// on a store that keeps no steps (a driver without idemdriver.Stepper,
	// or a schema that predates steps: idemdriver.ErrSchemaTooOld).
	ErrStepNotAllowed = protocol.ErrStepNotAllowed
	// ErrStepRepeated: a step name met twice in one execution.
	ErrStepRepeated = protocol.ErrStepRepeated
	// ErrStepName: a step name that is not 1 to 128 bytes of visible ASCII.
	ErrStepName = protocol.ErrStepName
	// ErrStepStarted is ReleaseKey's error once a step of the record's life
	// has started: a released key starts a new life, which relays a new
	// key, and the callee would apply the effect twice.
	ErrStepStarted = protocol.ErrStepStarted
	// ErrStepNotRecorded: fn returned, its result could not be recorded (the
	// store failed: the error wraps a *StoreError, so it matches
	// ErrStoreUnavailable too). The step stays started: answer a 5xx. The
	// retry runs an ordinary step again under the same relayed key; an
	// AtMostOnce one is never run again (see AtMostOnce).
	ErrStepNotRecorded = protocol.ErrStepNotRecorded
	// ErrStepResultUndecodable: the recorded result does not decode into
	// the step's type (it changed incompatibly between deploys). The step
	// is never run again for it: the record becomes UNKNOWN (reason
	// step-result-undecodable), and Step's error matches ErrOutcomeUnknown
	// too, until an operator resolves it (`idem resolve`).
	ErrStepResultUndecodable = protocol.ErrStepResultUndecodable
	// ErrStepUnreconciled: an AtMostOnce step started earlier without a
	// result, and its Reconcile function could not tell what became of it
	// (the callee did not answer, or it answered not applied about a start
	// younger than SettlesWithin); or this run's call of such a step ended
	// uncertain. Its execution is recorded FAILED, whatever the handler
	// answers, and over HTTP answered 503 step-unreconciled in the
	// handler's place: the next re-execution (the client's retry, the
	// completer's re-drive) asks again; it never runs the step.
	ErrStepUnreconciled = protocol.ErrStepUnreconciled
	// ErrOutcomeUnknown: the outcome of the request cannot be known: an
	// AtMostOnce step started and its result was not recorded, or a
	// recorded result no longer decodes (docs/contract.md section 11.3).
	// The record is UNKNOWN: never run again, never purged; every request
	// of its key is answered 409 outcome-unknown (no Retry-After) until an
	// operator resolves it (`idem resolve`). Step's error matches it as an
	// *UnknownError; Do's does.
	ErrOutcomeUnknown = protocol.ErrOutcomeUnknown
)

// StoreError is a failed store operation; it matches ErrStoreUnavailable.
// Op names the operation (claim, heartbeat, complete, fail, release, begin,
// commit) and Err is the driver's error (Unwrap).
type StoreError = protocol.StoreError

// ErrCommitPending is the cause of a 503 when an outcome's COMMIT has not
// returned within CompleteTimeout; it is not cancelled (docs/deployment.md).
var ErrCommitPending = protocol.ErrCommitPending
