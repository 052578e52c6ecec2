package protocol

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// stepEnd says how a step's function ended (docs/contract.md section 11.1).
type stepEnd int

const (
	// stepDone: a result (a value, or a definite error), to record.
	stepDone stepEnd = iota
	// stepNotApplied: the callee said nothing happened; the start is cleared.
	stepNotApplied
	// stepUncertain: the effect may have happened; the start stays.
	stepUncertain
)

// stepFunc runs a step's effect on ctx. It returns the encoded result to
// record when end is stepDone, and err otherwise.
type stepFunc func(ctx context.Context) (result []byte, end stepEnd, err error)

// ValidStepName reports whether name is 1 to idemdriver.MaxStepNameBytes
// bytes of visible ASCII, not beginning with idemdriver.InternalStepPrefix.
func ValidStepName(name string) bool {
	if len(name) == 0 || len(name) > idemdriver.MaxStepNameBytes || strings.HasPrefix(name, idemdriver.InternalStepPrefix) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x21 || name[i] > 0x7e {
			return false
		}
	}
	return true
}

// StepOptions are a step's options (idem.AtMostOnce, idem.Reconcile).
type StepOptions struct {
	// AtMostOnce: the step never runs twice; an earlier start without a
	// result is reconciled, or makes the record UNKNOWN.
	AtMostOnce bool
	// Reconcile asks the callee what became of an earlier start: a result
	// (stepDone), not applied (stepNotApplied: the step runs), or still
	// unknown (stepUncertain). nil: none.
	Reconcile stepFunc
	// Settle is how long after its start an earlier call may still take
	// effect at the callee: a not-applied answer about a younger start is
	// still unknown (docs/contract.md section 11.2). 0: none.
	Settle time.Duration
}

// step runs fn as the step name of e, relaying relay (the step's relayed
// key): its start committed before fn runs, its result as soon as fn
// returns. A step already recorded in this record life returns its result
// without running fn. An at-most-once step (o.AtMostOnce) started earlier
// without a result is never run again: o.Reconcile asks what became of it,
// and otherwise, or when it cannot tell, the record becomes UNKNOWN; one
// whose fn ends uncertain makes it UNKNOWN too. It returns the recorded
// result (whoever recorded it) or fn's error. Errors besides fn's:
// ErrStepName, ErrStepNotAllowed, ErrStepRepeated, ErrExecutionEnded,
// ErrLeaseLost (the execution no longer owns its record),
// ErrStepNotRecorded (fn ran, its result is not recorded; it wraps the
// *StoreError), an *UnknownError (the record is UNKNOWN now), a
// *StoreError, and ErrSealKeyMissing / ErrSealBroken for a stored result
// that does not open.
func (e *Execution) step(name, relay string, fn stepFunc, o StepOptions) ([]byte, error) {
	st, err := e.stepAllowed(name)
	if err != nil {
		return nil, err
	}
	life, p := e.life(), e.stepParams(name)
	start := func() (idemdriver.Step, error) {
		blob, keyID := e.cfg.Keyring.SealStep(life, seal.PartStepRelay, name, []byte(relay))
		ctx, cancel := e.detached()
		defer cancel()
		s, err := st.StartStep(ctx, idemdriver.StartStepParams{StepParams: p, Relay: blob, SealKey: keyID, AtMostOnce: o.AtMostOnce})
		switch {
		case errors.Is(err, idemdriver.ErrStepsUnsupported), errors.Is(err, idemdriver.ErrSchemaTooOld):
			return s, fmt.Errorf("%w: %w", ErrStepNotAllowed, err)
		case errors.Is(err, idemdriver.ErrFencedOut):
			return s, fmt.Errorf("%w: step %q not started", ErrLeaseLost, name)
		case err != nil:
			return s, &StoreError{Op: "step", Err: err}
		}
		return s, nil
	}
	if err := e.keepRedrive(st, life); err != nil {
		return nil, err
	}
	s, err := start()
	switch {
	case err != nil:
		return nil, err
	case s.Done:
		return e.openResult(life, s)
	case idemdriver.StepHeld(s) && s.StartedToken != p.FencingToken:
		// Started by an earlier execution, its outcome unrecorded: never
		// run again (docs/contract.md section 11.2).
		if o.Reconcile == nil {
			return nil, e.markUnknown(st, p, idemdriver.ReasonStepUnrecorded, nil)
		}
		result, end, rerr := o.Reconcile(e.ctx)
		if age := e.claimedAt().Sub(s.StartedAt); end == stepNotApplied && age < o.Settle {
			end, rerr = stepUncertain, fmt.Errorf("the callee answers that it was not applied (%w), but the earlier start is %s old, "+
				"under the step's SettlesWithin %s: the call may still take effect", rerr, age.Round(time.Millisecond), o.Settle)
		}
		switch end {
		case stepUncertain:
			// The callee cannot tell yet: the next re-execution asks again
			// (the completer's are bounded, then UNKNOWN).
			e.holdStep()
			return nil, fmt.Errorf("%w: step %q: %w", ErrStepUnreconciled, name, rerr)
		case stepDone:
			return e.finish(st, life, p, result)
		}
		if err := e.clear(st, p); err != nil {
			return nil, err
		}
		if s, err = start(); err != nil {
			return nil, err
		} else if s.Done || s.StartedToken != p.FencingToken {
			return nil, e.markUnknown(st, p, idemdriver.ReasonStepUnrecorded, nil) // another writer meanwhile
		}
	}
	fctx := e.ctx
	if o.AtMostOnce {
		// No callee of an at-most-once step can fence a stale owner: its
		// call is made only while the lease is live on this process's clock
		// too, and its context ends when it may no longer be (guard).
		var stop func()
		e.hb.confirm()
		fctx, stop = e.hb.guard(e.ctx)
		defer stop()
		if fctx.Err() != nil { // not called: its start is cleared, if still the owner's
			if err := e.clear(st, p); err != nil {
				e.cfg.Logger.WarnContext(e.parent, "idem: clearing a step not called; it stays started", "step", name,
					"scope", e.fence.Scope, "key", e.fence.Key, "err", err)
			}
			return nil, fmt.Errorf("step %q not called: %w", name, context.Cause(fctx))
		}
	}
	result, end, ferr := fn(fctx)
	switch {
	case end == stepNotApplied:
		if err := e.clear(st, p); err != nil {
			e.cfg.Logger.WarnContext(e.parent, "idem: clearing a step not applied; it stays started", "step", name,
				"scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		}
		return nil, ferr
	case end == stepUncertain && o.AtMostOnce && o.Reconcile == nil:
		return nil, e.markUnknown(st, p, idemdriver.ReasonStepUncertain, ferr)
	case end == stepUncertain && o.AtMostOnce:
		// Held: the next re-execution's reconcile function asks the
		// callee what became of it.
		e.holdStep()
		return nil, ferr
	case end == stepUncertain:
		return nil, ferr
	}
	return e.finish(st, life, p, result)
}

// claimedAt is when e's claim was made, on the database's clock: its
// lease's end less the lease.
func (e *Execution) claimedAt() time.Time {
	rec := e.c.res.Record
	if rec.LockedUntil == nil { // a claim holds a lease; a damaged record would not be claimed
		return rec.UpdatedAt
	}
	return rec.LockedUntil.Add(-e.p.LeaseDuration)
}

// life is e's record life, to which its steps are sealed.
func (e *Execution) life() seal.Life {
	return seal.Life{Scope: e.fence.Scope, Key: e.fence.Key, Created: e.fence.CreatedAt}
}

// stepParams names the step name of e's record life, under e's token.
func (e *Execution) stepParams(name string) idemdriver.StepParams {
	return idemdriver.StepParams{Scope: e.fence.Scope, Key: e.fence.Key, CreatedAt: e.fence.CreatedAt,
		FencingToken: e.fence.FencingToken, Name: name, ClockOffset: e.fence.ClockOffset}
}

// keepRedrive writes, before e's first step, the request kept for a
// re-drive (Job.Redrive) as the internal step idemdriver.KeptRequestStep:
// its Relay, sealed like a step's; the first writer of the record life
// wins (a re-execution's start leaves the Relay as it is).
func (e *Execution) keepRedrive(st idemdriver.Stepper, life seal.Life) error {
	e.mu.Lock()
	done := e.kept || e.redrive == nil
	e.kept = true
	e.mu.Unlock()
	if done {
		return nil
	}
	req, ok := e.redrive()
	if !ok {
		return nil
	}
	blob, keyID := e.cfg.Keyring.SealStep(life, seal.PartStepRelay, idemdriver.KeptRequestStep, seal.EncodeRequest(req))
	p := e.stepParams(idemdriver.KeptRequestStep)
	ctx, cancel := e.detached()
	defer cancel()
	_, err := st.StartStep(ctx, idemdriver.StartStepParams{StepParams: p, Relay: blob, SealKey: keyID})
	switch {
	case errors.Is(err, idemdriver.ErrStepsUnsupported), errors.Is(err, idemdriver.ErrSchemaTooOld):
		return fmt.Errorf("%w: %w", ErrStepNotAllowed, err)
	case errors.Is(err, idemdriver.ErrFencedOut):
		return fmt.Errorf("%w: the request was not kept for a re-drive", ErrLeaseLost)
	case err != nil:
		return &StoreError{Op: "keep request", Err: err}
	}
	return nil
}

// holdStep forces e's outcome FAILED, whatever its job answers: an
// at-most-once step is held unreconciled, and only a re-execution asks its
// reconcile function again.
func (e *Execution) holdStep() {
	e.mu.Lock()
	e.held = true
	e.mu.Unlock()
}

// stepHeld reports whether holdStep was called.
func (e *Execution) stepHeld() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held
}

// finish records result as p's step's result and returns the one
// recorded.
func (e *Execution) finish(st idemdriver.Stepper, life seal.Life, p idemdriver.StepParams, result []byte) ([]byte, error) {
	blob, keyID := e.cfg.Keyring.SealStep(life, seal.PartStepResult, p.Name, result)
	ctx, cancel := e.detached()
	s, err := st.FinishStep(ctx, idemdriver.FinishStepParams{StepParams: p, Result: blob, SealKey: keyID})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: step %q: %w", ErrStepNotRecorded, p.Name, &StoreError{Op: "finish step", Err: err})
	}
	return e.openResult(life, s)
}

// clear removes p's step's start marker (it did nothing).
func (e *Execution) clear(st idemdriver.Stepper, p idemdriver.StepParams) error {
	ctx, cancel := e.detached()
	defer cancel()
	if _, err := st.ClearStep(ctx, p); err != nil {
		return &StoreError{Op: "clear step", Err: err}
	}
	return nil
}

// markUnknown makes e's record UNKNOWN at p's step for reason (cause: what
// made it so) and returns the *UnknownError that e answers with from now
// on. When the store does not take it, it returns ErrLeaseLost or a
// *StoreError: the start marker stays, and the next execution meets it.
func (e *Execution) markUnknown(st idemdriver.Stepper, p idemdriver.StepParams, reason string, cause error) error {
	ctx, cancel := e.detached()
	err := st.MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: p, Reason: reason})
	cancel()
	switch {
	case errors.Is(err, idemdriver.ErrFencedOut):
		return fmt.Errorf("%w: step %q's outcome cannot be known, and another execution owns the record", ErrLeaseLost, p.Name)
	case err != nil:
		return &StoreError{Op: "mark unknown", Err: err}
	}
	uerr := &UnknownError{Step: p.Name, Reason: reason, Err: cause}
	e.cfg.Logger.ErrorContext(e.parent, "idem: the record's outcome cannot be known; it is held UNKNOWN for an operator (idem resolve)",
		"scope", e.fence.Scope, "key", e.fence.Key, "step", p.Name, "reason", reason, "err", cause)
	e.mu.Lock()
	e.unknown = uerr
	e.mu.Unlock()
	return uerr
}

// openResult opens s's recorded result. Under sealing, a step stored
// plain is refused as a plain record is (errPlainRecord), unless
// ReplayPlain: a result planted with an emptied seal_key authenticates
// nothing.
func (e *Execution) openResult(life seal.Life, s idemdriver.Step) ([]byte, error) {
	if s.SealKey == "" && e.cfg.Keyring != nil && !e.cfg.ReplayPlain {
		return nil, fmt.Errorf("step %q: %w", s.Name, errPlainRecord)
	}
	return e.cfg.Keyring.OpenStep(life, seal.PartStepResult, s.Name, s.SealKey, s.Result)
}

// stepAllowed checks that e may run the step name now and returns its
// store's Stepper; it remembers the name.
func (e *Execution) stepAllowed(name string) (idemdriver.Stepper, error) {
	if !ValidStepName(name) {
		return nil, fmt.Errorf("%w %q: 1 to %d bytes of visible ASCII, not beginning with %q", ErrStepName, name, idemdriver.MaxStepNameBytes, idemdriver.InternalStepPrefix)
	}
	st, ok := e.cfg.Store.(idemdriver.Stepper)
	single := isSingleWriter(e.cfg.Store)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.ended:
		return nil, ErrExecutionEnded
	case !ok:
		return nil, fmt.Errorf("%w: the store %T keeps no steps", ErrStepNotAllowed, e.cfg.Store)
	case e.cfg.OneCommit:
		return nil, fmt.Errorf("%w: in one-commit mode a step's commit would wait on the execution's own row lock; use the durable claim (docs/contract.md section 11.1)", ErrStepNotAllowed)
	case single && e.tx != nil:
		return nil, fmt.Errorf("%w: the claim's transaction holds the database's write lock (SQLite); run steps before idem.Tx", ErrStepNotAllowed)
	case e.steps[name]:
		return nil, fmt.Errorf("%w: %q (give each step of a loop its own name: refund/3)", ErrStepRepeated, name)
	}
	if e.steps == nil {
		e.steps = map[string]bool{}
	}
	e.steps[name] = true
	return st, nil
}

// stepsStarted reports whether a step of e's record life has started, in
// this execution or an earlier one (ReleaseKey is refused then).
func (e *Execution) stepsStarted() (bool, error) {
	e.mu.Lock()
	mine := len(e.steps) > 0
	e.mu.Unlock()
	st, ok := e.cfg.Store.(idemdriver.Stepper)
	if mine || !ok {
		return mine, nil
	}
	ctx, cancel := e.detached()
	defer cancel()
	list, err := st.Steps(ctx, e.stepParams(""))
	if errors.Is(err, idemdriver.ErrStepsUnsupported) {
		return false, nil
	}
	for _, s := range list {
		if !strings.HasPrefix(s.Name, idemdriver.InternalStepPrefix) {
			return true, nil
		}
	}
	return false, err
}
