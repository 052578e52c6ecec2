package idemdriver

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Stepper records an execution's steps: its calls whose effects live
// outside the database (CONTRACT section 11.1). A step is one row per
// (scope, stored key, record life, name), where the record life is the
// record's created_at: a new life of the key sees none of an earlier life's
// steps, and a record's steps go when the record is purged, released or
// dropped. Optional: the core refuses steps (idem.ErrStepNotAllowed) on a
// driver without it, so a wrapper around a store (instrumentation, fault
// injection) must implement it too, forwarding to the store's.
type Stepper interface {
	// StartStep commits the start marker of p.Name before its effect runs:
	// in one statement, while the record life is still owned under
	// p.FencingToken (PROCESSING, the same token and created_at), it
	// inserts the step, or, when the step exists without a result, marks
	// it started again under p.FencingToken (a re-execution runs a started
	// step again with the same relayed key). A step with a result is left
	// as it is. It returns the step as stored after the statement: Done
	// tells the caller to use its Result instead of running the step.
	//
	// An at-most-once step started by an earlier execution and without a
	// result is never marked started again (StartStepParams.AtMostOnce):
	// StartStep returns it as stored, whoever owns the life.
	//
	// When the life is no longer owned under the token (fenced out: taken
	// over, ended, released or purged) and the step has no result, it
	// writes nothing and returns ErrFencedOut.
	StartStep(ctx context.Context, p StartStepParams) (Step, error)
	// FinishStep records a started step's result, first writer wins: a
	// result already recorded is kept, and returned. It is not fenced by
	// the token, so the known result of an owner that lost its lease
	// meanwhile is kept. It returns the step as stored after the
	// statement, or ErrNotFound when no start marker exists (its record
	// was purged, released, or the start cleared).
	FinishStep(ctx context.Context, p FinishStepParams) (Step, error)
	// ClearStep removes a started step that has no result (the callee
	// said nothing was applied), while the record life is owned under
	// p.FencingToken. It reports whether a marker was removed.
	ClearStep(ctx context.Context, p StepParams) (bool, error)
	// Steps lists the steps of the record life (p.Scope, p.Key,
	// p.CreatedAt), in name order; p.FencingToken is not compared.
	Steps(ctx context.Context, p StepParams) ([]Step, error)
	// MarkUnknown ends the record life owned under p.FencingToken UNKNOWN
	// (CONTRACT section 11.3): state UNKNOWN, locked_until NULL and
	// expires_at FarFuture, so that no claim, purge or partition drop, of
	// this version or an earlier one, touches it; the step p.Name, when it
	// exists, keeps p.Reason. One transaction. When the life is not owned
	// under the token it writes nothing and returns ErrFencedOut.
	MarkUnknown(ctx context.Context, p UnknownParams) error
	// ResolveStep ends an UNKNOWN record life (CONTRACT section 11.3: an
	// operator's `idem resolve`, a reconcile function), a compare-and-set
	// on (scope, key, created_at, fencing token) and state UNKNOWN. When
	// p.Applied the step p.Name gets p.Result as its result (done, whatever
	// it held); otherwise its start is cleared (no result, StartedToken 0:
	// the next execution starts it again). Either keeps p.By, p.Why and the
	// database's now on the step, and the record becomes FAILED with
	// expires_at now + p.Retention, so the next request of its payload
	// resumes it in the same life. One transaction. When the record is not
	// that UNKNOWN life, or the step does not exist, it writes nothing and
	// returns ErrNotFound.
	ResolveStep(ctx context.Context, p ResolveStepParams) error
}

// FarFuture is the expires_at of an UNKNOWN record: later than any
// retention, so every claim, purge and partition drop leaves it alone.
var FarFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// The reasons a record is UNKNOWN (UnknownParams.Reason, Step.Reason).
const (
	// ReasonStepUncertain: an at-most-once step's function returned an
	// uncertain error (a timeout, a reset after sending).
	ReasonStepUncertain = "step-uncertain"
	// ReasonStepUnrecorded: an at-most-once step was started by an earlier
	// execution and has no result, and nothing could reconcile it.
	ReasonStepUnrecorded = "step-unrecorded"
	// ReasonStepResultUndecodable: a recorded result no longer decodes
	// into the step's type.
	ReasonStepResultUndecodable = "step-result-undecodable"
	// ReasonCompleterGaveUp: the completer re-drove the execution as many
	// times as it may, and it did not end (package completer).
	ReasonCompleterGaveUp = "completer-gave-up"
	// ReasonNotRedrivable: the completer cannot re-drive the execution: no
	// request was kept for it, or the kept one does not open or was cut.
	ReasonNotRedrivable = "not-redrivable"
)

// UnknownParams are the inputs of MarkUnknown: the step (a started one, or
// one whose result does not decode) and why.
type UnknownParams struct {
	StepParams
	Reason string // at most 64 bytes of ASCII: one of the Reason constants
}

// ResolveStepParams are the inputs of ResolveStep.
type ResolveStepParams struct {
	StepParams
	// Applied tells whether the step's effect happened. When true, Result
	// (sealed under SealKey when that is set) is recorded as its result.
	Applied bool
	Result  []byte
	SealKey string
	// By and Why say who resolved it and why (at most 200 bytes each),
	// kept on the step.
	By, Why string
	// Retention sets the resolved record's expires_at: now + Retention.
	Retention time.Duration
}

// MaxStepNameBytes is the longest step name every driver stores.
const MaxStepNameBytes = 128

// StepParams name one step of one record life.
type StepParams struct {
	Scope        string
	Key          string // the stored key
	CreatedAt    time.Time
	FencingToken int64
	Name         string // 1 to MaxStepNameBytes bytes
	ClockOffset  time.Duration
}

// StartStepParams are the inputs of StartStep.
type StartStepParams struct {
	StepParams
	// Relay is the step's relayed key as stored: sealed when the core
	// seals, opaque bytes to the driver.
	Relay []byte
	// SealKey names the key Relay (and later the Result) is sealed under;
	// empty when not sealed.
	SealKey string
	// AtMostOnce marks a step that must never run twice (CONTRACT section
	// 11.1). A start marker stored at-most-once without a result is not
	// marked started again: StartStep returns it as stored, StartedToken
	// another execution's, for the caller to reconcile or mark UNKNOWN; one
	// whose start was cleared by ResolveStep (StartedToken 0) is started
	// again.
	AtMostOnce bool
}

// FinishStepParams are the inputs of FinishStep.
type FinishStepParams struct {
	StepParams
	// Result is the step's encoded result, opaque bytes to the driver
	// (sealed when SealKey is set).
	Result  []byte
	SealKey string
}

// Step is a step as stored.
type Step struct {
	Name string
	// StartedToken is the fencing token of the execution that last
	// started it; 0 once ResolveStep cleared its start (not applied).
	StartedToken int64
	StartedAt    time.Time
	Relay        []byte
	// Done is true once a result is recorded; Result and FinishedAt are
	// set then.
	Done       bool
	Result     []byte
	FinishedAt time.Time
	// SealKey names the key Relay and Result are sealed under ("" when
	// not sealed).
	SealKey string
	// AtMostOnce is StartStepParams.AtMostOnce of its last start.
	AtMostOnce bool
	// Reason says why the record became UNKNOWN at this step
	// (MarkUnknown); "" otherwise.
	Reason string
	// ResolvedBy, ResolvedWhy and ResolvedAt are ResolveStep's; ResolvedAt
	// is zero when the step was never resolved.
	ResolvedBy, ResolvedWhy string
	ResolvedAt              time.Time
}

// ErrFencedOut is returned by StartStep when the record life is no longer
// owned under the params' fencing token.
var ErrFencedOut = errors.New("idemdriver: the execution no longer owns its record")

// ErrSchemaTooOld is wrapped by a Stepper's error when the store's schema
// predates the statement (a migration not yet applied): nothing was
// written. Apply the driver's migrations, then deploy handlers that use
// steps (CONTRACT section 11.3, rolling deploys).
var ErrSchemaTooOld = errors.New("idemdriver: the store's schema predates this statement; apply its migrations")

// ErrStepsUnsupported is wrapped by a Stepper's error when its store keeps
// no steps (a driver's schema that predates them wraps ErrSchemaTooOld
// instead): nothing was written.
var ErrStepsUnsupported = errors.New("idemdriver: this store keeps no steps")

// StepHeld reports whether s is an at-most-once start that StartStep never
// starts again: started (StartedToken not 0), without a result. Its effect
// may have happened; only a reconcile function or ResolveStep ends it.
func StepHeld(s Step) bool { return s.AtMostOnce && !s.Done && s.StartedToken != 0 }

// StepStarted reports whether s is a started step of the application's
// (CONTRACT section 11.4): not an internal one (InternalStepPrefix), with a
// result or a start; a start cleared by ResolveStep, not applied, is none.
// AbandonedLister's drivers state the same rule in SQL.
func StepStarted(s Step) bool {
	return !strings.HasPrefix(s.Name, InternalStepPrefix) && (s.Done || s.StartedToken != 0)
}

// InternalStepPrefix begins the names of the steps idem writes itself (the
// request kept for a re-drive, KeptRequestStep); an application's step
// name never begins with it. An execution with internal steps only has
// started no step.
const InternalStepPrefix = "idem:"

// KeptRequestStep is the internal step whose Relay holds the request kept
// for a re-drive (CONTRACT section 11.4): written before the execution's
// first step starts, first writer wins per record life (a takeover keeps
// the first), sealed like a step, never finished.
const KeptRequestStep = InternalStepPrefix + "request"

// AbandonedLister lists the executions a completer may finish (CONTRACT
// section 11.4): abandoned (PROCESSING past its lease, or FAILED), untouched
// for p.Grace, and past a started step (a step of the record's life whose
// name does not begin with InternalStepPrefix, with a result or a start:
// a start cleared by an operator's resolution, not applied, is none: the
// record waits for its client, as one that never reached a step does).
// Optional: a completer needs
// it (and Stepper).
type AbandonedLister interface {
	// Abandoned returns at most p.Limit such records, least recently
	// updated first, without their responses, and the database's now.
	Abandoned(ctx context.Context, p AbandonedParams) ([]Record, time.Time, error)
}

// AbandonedParams are the inputs of Abandoned.
type AbandonedParams struct {
	// Grace: updated_at <= now - Grace. Not negative.
	Grace time.Duration
	// Limit is the most records returned. Must be positive.
	Limit       int
	ClockOffset time.Duration
}

// UnknownCounter counts the UNKNOWN records, cheaply enough for every
// metrics scrape: through the expires_at index, which holds them at its
// end (FarFuture). Optional (idemotel.NewUnknownGauges reads it).
type UnknownCounter interface {
	// CountUnknown returns how many records are UNKNOWN, when the oldest
	// of them last changed (zero with none), and the database's now plus
	// offset.
	CountUnknown(ctx context.Context, offset time.Duration) (n int64, oldest, now time.Time, err error)
}
