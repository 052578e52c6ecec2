package idemdrivertest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// The wait mode (idem.EngineOptions.Waiting.Wait) in both modes: duplicates wait for
// the owner's outcome, in this process and in another (a second engine on a
// driver of its own, as another process has), and get its answer.

func waitCases(mode func(func(*testing.T, Harness, bool)) func(*testing.T, Harness), oneCommit, singleWriter bool) []suiteCase {
	cases := []suiteCase{
		{"WaitGetsTheOwnersAnswer", mode(waitGetsTheOwnersAnswer)},
		{"WaitAfterAFailureRunsOnce", mode(waitAfterAFailureRunsOnce)},
		{"WaitTakesOverADeadOwner", mode(waitTakesOverADeadOwner)},
		{"WaitEndsWithTheCaller", mode(waitEndsWithTheCaller)},
	}
	if !oneCommit || !singleWriter {
		// One-commit on a single-writer store queues every duplicate of a
		// running key for the write lock, whatever the wait.
		cases = append(cases, suiteCase{"WaitRunsOutGivesInFlight", mode(waitRunsOutGivesInFlight)})
	}
	if !oneCommit {
		cases = append(cases, suiteCase{"WaitersAreBounded", waitersAreBounded})
	}
	return cases
}

// waitPair returns two engines with cfg on one database: the second on a
// driver of its own when the harness has SecondDriver (another process).
func waitPair(t *testing.T, h Harness, oneCommit bool, cfg idem.EngineOptions) (g, other *idem.Engine, d idemdriver.Driver) {
	t.Helper()
	g, d = newEngine(t, h, oneCommit, cfg)
	cfg.OneCommit.Enabled, cfg.Logger = oneCommit, slog.New(slog.DiscardHandler)
	store := d
	if h.SecondDriver != nil && !(oneCommit && h.MultiMaster) {
		store = h.SecondDriver(t, d)
	}
	other, err := idem.NewEngineWith(store, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	return g, other, d
}

// owner runs key's first execution on g until release is closed, answering
// "one" (or failing as fail says); started is closed once it runs.
func owner(g *idem.Engine, key string, fail func() error) (started chan struct{}, release chan struct{}, done chan error) {
	started, release, done = make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		var err error
		var ran atomic.Bool
		// Closed whatever happens, so that a test waiting for the owner to
		// start never hangs: an owner that ended without running fn reports
		// why on done.
		defer func() {
			if !ran.Load() {
				close(started)
			}
			done <- err
		}()
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panicked: %v", r)
			}
		}()
		for {
			_, err = g.Do(context.Background(), doParams(key, "a"), func(context.Context) (idem.Result, error) {
				ran.Store(true)
				close(started)
				<-release
				if fail != nil {
					return idem.Result{Status: 201, Body: []byte("one")}, fail()
				}
				return idem.Result{Status: 201, Body: []byte("one")}, nil
			})
			// A claim that did not answer in time on a loaded machine (fn not
			// run): retried, as a client would.
			if !ran.Load() && errors.Is(err, idem.ErrStoreUnavailable) {
				continue
			}
			return
		}
	}()
	return started, release, done
}

// duplicates starts n calls of key on each engine with fn; the results
// come on the returned channel.
func duplicates(engines []*idem.Engine, n int, key string, fn func(context.Context) (idem.Result, error)) (chan error, *sync.WaitGroup) {
	out := make(chan error, n*len(engines))
	var wg sync.WaitGroup
	for _, e := range engines {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := e.Do(context.Background(), doParams(key, "a"), fn)
				if err == nil {
					err = bodyIs(res, "")
				}
				out <- err
			}()
		}
	}
	return out, &wg
}

func bodyIs(res idem.Result, want string) error {
	if want != "" && string(res.Body) != want {
		return fmt.Errorf("answered %q, not %q", res.Body, want)
	}
	return nil
}

// waitingOn waits until g has n waiters (a state, not a time).
func waitingOn(t *testing.T, g *idem.Engine, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for g.Waiters() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters after a minute, not %d", g.Waiters(), n)
		}
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
}

// waitingIn waits until the duplicates wait: every one of g's, and of
// other's every one but, in one-commit mode, the one whose claim waits on
// the key's row lock (or, on a single-writer store, the write lock).
func waitingIn(t *testing.T, g, other *idem.Engine, n int, oneCommit bool) {
	t.Helper()
	waitingOn(t, g, n)
	if oneCommit {
		waitingOn(t, other, n-1)
		return
	}
	waitingOn(t, other, n)
}

func waitGetsTheOwnersAnswer(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, other, _ := waitPair(t, h, oneCommit, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Minute}})
	started, release, done := owner(g, "k", nil)
	<-started
	var runs atomic.Int32
	const n = 10
	out, wg := duplicates([]*idem.Engine{g, other}, n, "k", counted(&runs, "two"))
	waitingIn(t, g, other, n, oneCommit)
	close(release)
	require.NoError(t, <-done)
	wg.Wait()
	close(out)
	for err := range out {
		require.NoError(t, err, "every duplicate waits for the owner and gets its answer, never ErrInFlight")
	}
	require.Zero(t, runs.Load(), "no duplicate ran")
	require.Zero(t, g.Waiters()+other.Waiters())
}

// The owner fails, or panics: one duplicate runs, as a retry would, and the
// others get its answer.
func waitAfterAFailureRunsOnce(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	for _, fail := range []struct {
		name string
		err  func() error
	}{
		{"fails", func() error { return errors.New("declined") }},
		{"panics", func() error { panic("boom") }},
	} {
		t.Run(fail.name, func(t *testing.T) {
			g, other, _ := waitPair(t, h, oneCommit, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Minute}})
			started, release, done := owner(g, "k", fail.err)
			<-started
			var runs atomic.Int32
			const n = 5
			out, wg := duplicates([]*idem.Engine{g, other}, n, "k", counted(&runs, "two"))
			waitingIn(t, g, other, n, oneCommit)
			close(release)
			require.Error(t, <-done)
			wg.Wait()
			close(out)
			for err := range out {
				require.NoError(t, err)
			}
			require.EqualValues(t, 1, runs.Load(), "one duplicate ran after the owner's failure")
			res, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "three"))
			require.NoError(t, err)
			require.Equal(t, "two", string(res.Body))
		})
	}
}

// An owner that died (its claim made directly, with a short lease, and never
// completed): the waiters take over when its lease runs out, one runs.
func waitTakesOverADeadOwner(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, other, d := waitPair(t, h, oneCommit, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Minute}})
	sum := sha256.Sum256([]byte("a"))
	dead := idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "DO", Path: "orders", Fingerprint: sum[:],
		LeaseDuration: 300 * time.Millisecond, Retention: retention}
	require.True(t, claim(t, d, dead).Claimed)
	var runs atomic.Int32
	const n = 5
	out, wg := duplicates([]*idem.Engine{g, other}, n, "k", counted(&runs, "two"))
	wg.Wait()
	close(out)
	for err := range out {
		require.NoError(t, err, "a waiter whose owner died takes over, as a retry would")
	}
	require.EqualValues(t, 1, runs.Load())
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.Equal(t, 2, rec.Attempts, "a takeover")
}

// A caller that goes away stops waiting; the owner's outcome is kept.
func waitEndsWithTheCaller(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour}})
	started, release, done := owner(g, "k", nil)
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	gone := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, doParams("k", "a"), counted(&runs, "two"))
		gone <- err
	}()
	waitingOn(t, g, 1)
	cancel()
	require.ErrorIs(t, <-gone, idem.ErrInFlight)
	require.Zero(t, g.Waiters())
	close(release)
	require.NoError(t, <-done)
	res, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "two"))
	require.NoError(t, err)
	require.Equal(t, "one", string(res.Body))
	require.Zero(t, runs.Load())
}

// A wait shorter than the owner's execution ends in ErrInFlight; DoParams.Wait
// below zero does not wait.
func waitRunsOutGivesInFlight(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{
		Waiting:   idem.WaitOptions{Wait: 50 * time.Millisecond, Max: time.Minute},
		OneCommit: idem.OneCommitOptions{Wait: oneCommitWait(oneCommit)},
	})
	started, release, done := owner(g, "k", nil)
	<-started
	var runs atomic.Int32
	for _, wait := range []time.Duration{0, -1, 100 * time.Millisecond} {
		p := doParams("k", "a")
		p.Wait = wait
		_, err := g.Do(t.Context(), p, counted(&runs, "two"))
		require.ErrorIs(t, err, idem.ErrInFlight, "wait %s", wait)
	}
	close(release)
	require.NoError(t, <-done)
	require.Zero(t, runs.Load())
}

func oneCommitWait(oneCommit bool) time.Duration {
	if oneCommit {
		return 50 * time.Millisecond
	}
	return 0
}

// Past MaxWaiters a duplicate is answered ErrInFlight at once.
func waitersAreBounded(t *testing.T, h Harness) {
	t.Parallel()
	g, _ := newEngine(t, h, false, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, MaxWaiters: 2}})
	started, release, done := owner(g, "k", nil)
	<-started
	var runs atomic.Int32
	out, wg := duplicates([]*idem.Engine{g}, 2, "k", counted(&runs, "two"))
	waitingOn(t, g, 2)
	_, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "two"))
	require.ErrorIs(t, err, idem.ErrInFlight, "the third waiter is refused")
	close(release)
	require.NoError(t, <-done)
	wg.Wait()
	close(out)
	for err := range out {
		require.NoError(t, err)
	}
	require.Zero(t, runs.Load())
}
