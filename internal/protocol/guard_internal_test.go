package protocol

import (
	"context"
	"errors"
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
// function is now called, and runs, only while a whole lease has not passed
// on this process's clock since the last renewal the store confirmed. The
// pause is its effect on that clock: the last confirmed renewal moved back.
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

	t.Run("resumed past the lease: not called", func(t *testing.T) {
		var calls atomic.Int32
		j := &stepJob{before: pausedFor(2 * lease), fn: func(context.Context) (string, error) { calls.Add(1); return "tr_1", nil }}
		a := run(t, "paused", j)
		require.Equal(t, KindRan, a.Kind, "%v", a.Err)
		require.Zero(t, calls.Load(), "the transfer is not sent")
		require.ErrorIs(t, j.err, ErrLeaseLost)
		rec, err := store.Get(t.Context(), idemdriver.GetParams{Scope: "s", Key: "paused"})
		require.NoError(t, err)
		steps, err := store.Steps(t.Context(), idemdriver.StepParams{Scope: "s", Key: "paused", CreatedAt: rec.CreatedAt})
		require.NoError(t, err)
		for _, s := range steps {
			require.False(t, idemdriver.StepStarted(s), "its start is cleared: the next owner runs it")
		}
	})
	t.Run("the lease runs out during the call: its context ends", func(t *testing.T) {
		j := &stepJob{before: pausedFor(lease - 50*time.Millisecond), fn: func(ctx context.Context) (string, error) {
			select {
			case <-ctx.Done():
				return "", context.Cause(ctx)
			case <-time.After(lease / 2): // the renewals' own check would come later still
				return "", errors.New("the context did not end")
			}
		}}
		a := run(t, "late", j)
		require.ErrorIs(t, j.err, ErrLeaseLost)
		// The call was cut, maybe after its bytes left: uncertain, so held.
		require.Equal(t, KindOutcomeUnknown, a.Kind, "%v", a.Err)
	})
}
