package protocol

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/seal"
)

// stepJob runs, in its execution, before, then an at-most-once step whose
// function is fn; it keeps the step's error.
type stepJob struct {
	before func(e *Execution)
	fn     func(ctx context.Context) (string, error)
	err    error
}

func (j *stepJob) Run(ctx context.Context) (int, Override) {
	e, _ := FromContext(ctx)
	j.before(e)
	_, j.err = RunStep(e, "transfer", "relayed", j.fn, nil, true, 0)
	return 503, ByPolicy
}
func (j *stepJob) Response() idemdriver.Response {
	return idemdriver.Response{Status: 503, BodyStored: true}
}
func (j *stepJob) Kept(int64) seal.Request       { return seal.Request{} }
func (j *stepJob) Redrive() (seal.Request, bool) { return seal.Request{}, false }

// pausedAfterStart is a store whose step start is followed, before its
// caller goes on, by takeover: what a pause there past the lease allows.
type pausedAfterStart struct {
	*idemsqlite.Driver
	takeover func()
}

func (p *pausedAfterStart) StartStep(ctx context.Context, sp idemdriver.StartStepParams) (idemdriver.Step, error) {
	s, err := p.Driver.StartStep(ctx, sp)
	if err == nil {
		p.takeover()
	}
	return s, err
}

func pausedFor(d time.Duration) func(e *Execution) { // the last renewal confirmed d ago
	return func(e *Execution) {
		e.hb.mu.Lock()
		e.hb.lastOK = time.Now().Add(-d)
		e.hb.mu.Unlock()
	}
}

// Regression (a fresh user's try): a process frozen (SIGSTOP) inside an
// at-most-once step past its lease, and resumed after another took the key
// over and ran the step, sent its own call too before its renewal learned
// the lease was lost: the bank made two transfers, 6 runs in 6. The step's
// function is now called only after a renewal the store confirms, and runs
// only while a whole lease has not passed on this process's clock since the
// last one. A pause inside the function is its effect on that clock: the
// last confirmed renewal moved back.
func TestAtMostOnceStepStopsWithTheLocalLease(t *testing.T) {
	store, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "g.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(t.Context()))
	const lease = 30 * time.Second // no renewal is due while the test runs
	eng := New(Config{Store: store, LeaseDuration: lease, Retention: time.Hour, ClaimTimeout: 5 * time.Second,
		CompleteTimeout: 5 * time.Second, MaxExecution: time.Minute, InFlightRetryAfter: time.Second,
		Outcome: func(int) Outcome { return Failed }, Logger: slog.New(slog.DiscardHandler)})
	run := func(t *testing.T, key string, j *stepJob) Answer {
		t.Helper()
		p := idemdriver.ClaimParams{Scope: "s", Key: key, Method: "DO", Fingerprint: make([]byte, 32), LeaseDuration: lease, Retention: time.Hour}
		return eng.Run(t.Context(), p, key, 0, j)
	}

	t.Run("resumed after a takeover: not called", func(t *testing.T) {
		var calls atomic.Int32
		// The process pauses right after the step's start commits, past
		// its lease, and another takes the key over meanwhile.
		paused := &pausedAfterStart{Driver: store, takeover: func() {
			res, err := store.Claim(t.Context(), idemdriver.ClaimParams{Scope: "s", Key: "paused", Method: "DO", Fingerprint: make([]byte, 32),
				LeaseDuration: lease, Retention: time.Hour, ClockOffset: 2 * lease})
			require.NoError(t, err)
			require.True(t, res.Claimed)
		}}
		cfg := eng.cfg
		cfg.Store = paused
		j := &stepJob{before: func(*Execution) {}, fn: func(context.Context) (string, error) { calls.Add(1); return "tr_1", nil }}
		p := idemdriver.ClaimParams{Scope: "s", Key: "paused", Method: "DO", Fingerprint: make([]byte, 32), LeaseDuration: lease, Retention: time.Hour}
		a := New(cfg).Run(t.Context(), p, "paused", 0, j)
		require.Equal(t, KindLeaseLost, a.Kind, "%v", a.Err)
		require.Zero(t, calls.Load(), "the transfer is not sent")
		require.ErrorIs(t, j.err, ErrLeaseLost)
	})
	// Regression (a second fresh user's try): paused inside the function
	// before its look at the context, it found the context live as it
	// resumed, 8 runs in 13, and made its call (the guard's timer had not
	// run yet). The pause's effect on this process's clock: the last
	// confirmed renewal moved back a whole lease, the guard's timer still
	// asleep.
	t.Run("paused inside the call: its context has ended", func(t *testing.T) {
		var calls atomic.Int32
		var cause error
		j := &stepJob{before: func(*Execution) {}, fn: func(ctx context.Context) (string, error) {
			e, _ := FromContext(ctx)
			pausedFor(lease + time.Millisecond)(e)
			if ctx.Err() != nil {
				cause = context.Cause(ctx)
				return "", cause
			}
			calls.Add(1) // a call that takes no context: a file, a socket
			return "tr_2", nil
		}}
		a := run(t, "late", j)
		require.Zero(t, calls.Load(), "the call is not made")
		require.ErrorIs(t, cause, ErrLeaseLost)
		// Cut before the call, but the store cannot know: uncertain, so held.
		require.Equal(t, KindOutcomeUnknown, a.Kind, "%v", a.Err)
	})
	// A select that looked at the context before the lease ran out is woken
	// by the guard's timer.
	t.Run("a select that looked before: its context ends", func(t *testing.T) {
		var cause error
		j := &stepJob{before: func(e *Execution) {
			pausedFor(lease - 50*time.Millisecond)(e)
			ctx, stop := e.hb.guard(e.ctx)
			defer stop()
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(lease / 2): // the renewals' own check would come later still
			}
		}, fn: func(context.Context) (string, error) { return "tr_3", nil }}
		run(t, "select", j)
		require.ErrorIs(t, cause, ErrLeaseLost)
	})
}
