package idemdriver

import (
	"context"
	"errors"
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
	// started it.
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
}

// ErrFencedOut is returned by StartStep when the record life is no longer
// owned under the params' fencing token.
var ErrFencedOut = errors.New("idemdriver: the execution no longer owns its record")

// ErrStepsUnsupported is wrapped by a Stepper's error when its store keeps
// no steps (idempgx on a partitioned table): nothing was written.
var ErrStepsUnsupported = errors.New("idemdriver: this store keeps no steps")
