package idemdrivertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// runRenew holds an idemdriver.Renewer to Heartbeat's rules, lease by
// lease, and the engine's renewals to a pool that the request path has
// exhausted (Harness.Starve).
func runRenew(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"ExtendsEveryLease", renewExtendsEveryLease},
		{"FencedPerLease", renewFencedPerLease},
		{"NoLeases", renewNoLeases},
		{"ManyLeases", renewManyLeases},
		{"OutlivesAStarvedPool", renewOutlivesAStarvedPool},
	})
}

// renewer returns d's Renewer, skipping t when it has none.
func renewer(t *testing.T, d idemdriver.Driver) idemdriver.Renewer {
	t.Helper()
	r, ok := d.(idemdriver.Renewer)
	if !ok {
		t.Skipf("%T does not implement idemdriver.Renewer", d)
	}
	return r
}

// renew renews fences on r with the suite's lease, the clock moved by
// offset, and returns what it answered.
func renew(t *testing.T, r idemdriver.Renewer, offset time.Duration, fences ...idemdriver.FenceParams) []bool {
	t.Helper()
	got, err := r.Renew(context.Background(), idemdriver.RenewParams{Leases: fences, LeaseDuration: lease, ClockOffset: offset})
	require.NoError(t, err)
	require.Len(t, got, len(fences), "one answer per lease")
	return got
}

// Renew extends each lease from the database's clock (moved by
// ClockOffset), as Heartbeat does for one: past the first lease a claim of
// each key is answered from the live renewed lease, and past the renewed
// one it takes over.
func renewExtendsEveryLease(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	r := renewer(t, d)
	clock := &Clock{}
	sd := Shift(d, clock)
	var fences []idemdriver.FenceParams
	for _, k := range []string{"a", "b", "c"} {
		fences = append(fences, fence(claim(t, sd, params("acct", k, "body")).Record))
	}
	clock.Advance(lease - 5*time.Second)
	require.Equal(t, []bool{true, true, true}, renew(t, r, clock.Offset(), fences...))
	clock.Advance(10 * time.Second) // past the first lease, within the renewed one
	for _, f := range fences {
		again := claim(t, sd, params("acct", f.Key, "body"))
		require.False(t, again.Claimed, "%s: renewed", f.Key)
		require.InDelta(t, (lease - 10*time.Second).Seconds(), again.Record.LeaseLeft.Seconds(), 5, f.Key)
	}
	clock.Advance(lease)
	for _, f := range fences {
		take := claim(t, sd, params("acct", f.Key, "body"))
		require.True(t, take.Claimed && take.TookOver, "%s: the renewed lease ran out", f.Key)
	}
}

// Each lease is fenced alone, as Heartbeat's: the owned ones are renewed
// and reported so; a lease taken over, completed, failed, released, of
// another life (created_at) or never claimed is reported lost, and its row
// is left as it was (the new owner's lease is not extended by the old one's
// renewal).
func renewFencedPerLease(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	r := renewer(t, d)
	sd, old := setup(t, d, "EXPIRED_LEASE", params("acct", "taken", "body"))
	take := claim(t, sd, params("acct", "taken", "body"))
	require.True(t, take.Claimed)
	owned := fence(claim(t, sd, params("acct", "owned", "body")).Record)
	owned2 := fence(claim(t, sd, params("acct", "owned2", "body")).Record)
	done := fence(claim(t, sd, params("acct", "done", "body")).Record)
	require.True(t, complete(t, sd, done, okResponse("{}")))
	failed := fence(claim(t, sd, params("acct", "failed", "body")).Record)
	require.True(t, wrote(t, sd.Fail, failed))
	released := fence(claim(t, sd, params("acct", "released", "body")).Record)
	require.True(t, wrote(t, sd.Release, released))
	otherLife := fence(claim(t, sd, params("acct", "life", "body")).Record)
	otherLife.CreatedAt = otherLife.CreatedAt.Add(-time.Second)
	never := idemdriver.FenceParams{Scope: "acct", Key: "never", FencingToken: 1, CreatedAt: owned.CreatedAt}
	before := record(t, d, "acct", "taken")

	clock := sd.Clock.Offset() + time.Second
	got := renew(t, r, clock, owned, fence(old), done, failed, released, otherLife, never, owned2)
	require.Equal(t, []bool{true, false, false, false, false, false, false, true}, got)

	after := record(t, d, "acct", "taken")
	require.Equal(t, take.Record.FencingToken, after.FencingToken)
	require.Equal(t, before.LockedUntil, after.LockedUntil, "the stale owner's renewal left the new owner's lease alone")
	require.Equal(t, idemdriver.StateSucceeded, record(t, d, "acct", "done").State)
	require.Nil(t, record(t, d, "acct", "done").LockedUntil)
	require.Equal(t, idemdriver.StateFailed, record(t, d, "acct", "failed").State)
	requireGone(t, d, "acct", "released")
	requireGone(t, d, "acct", "never")
	require.Equal(t, idemdriver.StateProcessing, record(t, d, "acct", "life").State)
}

// No lease: no error and no answer.
func renewNoLeases(t *testing.T, h Harness) {
	t.Parallel()
	r := renewer(t, h.NewDriver(t))
	require.Empty(t, renew(t, r, 0))
}

// A process with more executions in flight than a driver sends in one
// statement: every answer lands on its own lease, the lost ones (at the
// edges of the drivers' batches of 1,000) included.
func renewManyLeases(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	r := renewer(t, d)
	const n = 1003
	fences := make([]idemdriver.FenceParams, n)
	for i := range n {
		res := claim(t, d, params("acct", fmt.Sprintf("k%04d", i), "body"))
		require.True(t, res.Claimed)
		fences[i] = fence(res.Record)
	}
	for _, i := range []int{0, 999, 1000, n - 1} {
		require.True(t, complete(t, d, fences[i], okResponse("{}")))
	}
	var lost []int
	for i, ok := range renew(t, r, 0, fences...) {
		if !ok {
			lost = append(lost, i)
		}
	}
	require.Equal(t, []int{0, 999, 1000, n - 1}, lost, "the leases reported lost")
}

// The lease of an execution whose handler runs longer than the lease is
// renewed while every connection of the store's pool is taken by the
// request path (Harness.Starve): no execution loses its lease to its own
// pool. Regression (issue 32): renewals waited for pool connections behind
// a burst's claims, and after a whole lease without one each execution gave
// up its lease and answered 503 (967 of 1,000 requests, lease 3 s).
func renewOutlivesAStarvedPool(t *testing.T, h Harness) {
	if h.Starve == nil {
		t.Skip("Harness.Starve is not set: the driver's pool cannot be exhausted (SQLite's has no bound)")
	}
	require.NotNil(t, h.SecondDriver, "Harness.SecondDriver watches the leases while the pool is starved")
	t.Parallel()
	const (
		// The lease: each renewal has a second (LeaseDuration/3)
		// on a machine that may be loaded, and a lease has three.
		short      = 3 * time.Second
		executions = 8
	)
	d := h.NewDriver(t)
	watch := h.SecondDriver(t, d)
	var lost atomic.Int32 // executions whose lease ran out or was lost
	g, err := idem.NewEngineWith(d, idem.EngineOptions{
		Lease:  idem.LeaseOptions{Duration: short},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventLeaseLost || e.Kind == idem.EventStoreUnavailable {
				lost.Add(1)
			}
		}),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })

	var running, ended sync.WaitGroup
	running.Add(executions)
	ended.Add(executions)
	// fn outlives its first lease: it returns once its record shows a
	// lease renewed past twice the first (read through another pool), or
	// when its context ends (its lease lost or given up).
	fn := func(key string) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			defer ended.Done()
			running.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return idem.Result{}, context.Cause(ctx)
				case <-tick.C:
				}
				rec, err := watch.Get(context.Background(), idemdriver.GetParams{Scope: "acct", Key: key})
				if err == nil && rec.LockedUntil != nil && !rec.LockedUntil.Before(rec.CreatedAt.Add(2*short)) {
					return idem.Result{Status: 201, Body: []byte(key)}, nil
				}
			}
		}
	}
	errs := make(chan error, executions)
	for i := range executions {
		key := fmt.Sprintf("k%d", i)
		go func() {
			_, err := g.Do(context.Background(), idem.DoParams{Scope: "acct", Key: key, Payload: []byte(key)}, fn(key))
			errs <- err
		}()
	}
	running.Wait() // every execution has claimed: now the pool is taken
	release := h.Starve(t, d)
	ended.Wait() // every handler has returned, renewed or not
	release()
	var failed []error
	for range executions {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	require.Zero(t, lost.Load(), "executions that lost their lease to their own pool: %v", failed)
	require.Empty(t, failed)
	for i := range executions {
		require.Equal(t, idemdriver.StateSucceeded, record(t, d, "acct", fmt.Sprintf("k%d", i)).State)
	}
}
