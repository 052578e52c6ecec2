package idemdrivertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Clock moves a driver's view of the database clock: every statement made
// through ShiftedDriver adds the clock's offset to the database's own now,
// so tests reach lease expiry and retention without sleeping.
type Clock struct{ offset atomic.Int64 }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// Offset returns how far the clock has been moved.
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// ShiftedDriver wraps a real driver; each call carries the clock's offset.
type ShiftedDriver struct {
	idemdriver.Driver
	Clock *Clock
}

// Shift returns d seen through clock c.
func Shift(d idemdriver.Driver, c *Clock) *ShiftedDriver { return &ShiftedDriver{Driver: d, Clock: c} }

func (s *ShiftedDriver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Claim(ctx, p)
}

func (s *ShiftedDriver) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Heartbeat(ctx, p)
}

func (s *ShiftedDriver) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Complete(ctx, p)
}

func (s *ShiftedDriver) Fail(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Fail(ctx, p)
}

func (s *ShiftedDriver) Begin(ctx context.Context) (idemdriver.Tx, error) {
	tx, err := s.Driver.Begin(ctx)
	if err != nil {
		return nil, err
	}
	st := shiftedTx{Tx: tx, clock: s.Clock}
	if cc, ok := tx.(idemdriver.CompleteCommitter); ok {
		return shiftedCommitTx{st, cc}, nil
	}
	return st, nil
}

type shiftedTx struct {
	idemdriver.Tx
	clock *Clock
}

func (t shiftedTx) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	p.ClockOffset += t.clock.Offset()
	return t.Tx.Complete(ctx, p)
}

// shiftedCommitTx is a shiftedTx whose driver sends the completion and the
// COMMIT together: it keeps idemdriver.CompleteCommitter visible.
type shiftedCommitTx struct {
	shiftedTx
	cc idemdriver.CompleteCommitter
}

func (t shiftedCommitTx) CompleteCommit(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	p.ClockOffset += t.clock.Offset()
	return t.cc.CompleteCommit(ctx, p)
}

func (s *ShiftedDriver) Release(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Release(ctx, p)
}

func (s *ShiftedDriver) Get(ctx context.Context, p idemdriver.GetParams) (idemdriver.Record, error) {
	p.ClockOffset += s.Clock.Offset()
	return s.Driver.Get(ctx, p)
}

// stepper is the shifted driver's idemdriver.Stepper, or an error wrapping
// idemdriver.ErrStepsUnsupported when it has none.
func (s *ShiftedDriver) stepper() (idemdriver.Stepper, error) {
	st, ok := s.Driver.(idemdriver.Stepper)
	if !ok {
		return nil, fmt.Errorf("%T: %w", s.Driver, idemdriver.ErrStepsUnsupported)
	}
	return st, nil
}

func (s *ShiftedDriver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	st, err := s.stepper()
	if err != nil {
		return idemdriver.Step{}, err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.StartStep(ctx, p)
}

func (s *ShiftedDriver) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	st, err := s.stepper()
	if err != nil {
		return idemdriver.Step{}, err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.FinishStep(ctx, p)
}

func (s *ShiftedDriver) ClearStep(ctx context.Context, p idemdriver.StepParams) (bool, error) {
	st, err := s.stepper()
	if err != nil {
		return false, err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.ClearStep(ctx, p)
}

func (s *ShiftedDriver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	st, err := s.stepper()
	if err != nil {
		return nil, err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.Steps(ctx, p)
}

func (s *ShiftedDriver) MarkUnknown(ctx context.Context, p idemdriver.UnknownParams) error {
	st, err := s.stepper()
	if err != nil {
		return err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.MarkUnknown(ctx, p)
}

func (s *ShiftedDriver) ResolveStep(ctx context.Context, p idemdriver.ResolveStepParams) error {
	st, err := s.stepper()
	if err != nil {
		return err
	}
	p.ClockOffset += s.Clock.Offset()
	return st.ResolveStep(ctx, p)
}
