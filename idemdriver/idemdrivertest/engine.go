package idemdrivertest

import (
	"context"
	"errors"
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

// runEngine holds Engine.Do to the protocol in both modes, durable-claim and
// one-commit (the latter with an idemdriver.TxClaimer): the guarantees of
// the HTTP front.
func runEngine(t *testing.T, h Harness) {
	for _, mode := range []struct {
		name      string
		oneCommit bool
	}{{"DurableClaim", false}, {"OneCommit", true}} {
		t.Run(mode.name, func(t *testing.T) {
			run := func(c func(*testing.T, Harness, bool)) func(*testing.T, Harness) {
				return func(t *testing.T, h Harness) { c(t, h, mode.oneCommit) }
			}
			cases := []suiteCase{
				{"RunsOnceThenReplays", run(engineRunsOnceThenReplays)},
				{"ErrorIsNeverASuccess", run(engineErrorIsNeverASuccess)},
				{"ConcurrentDuplicatesRunOnce", run(engineConcurrentDuplicatesRunOnce)},
				{"BurstOfACompletedKeyReplays", run(engineBurstOfACompletedKeyReplays)},
				{"BusinessWriteCommitsWithOutcome", run(engineBusinessWriteCommitsWithOutcome)},
				{"PanicLetsTheRetryRun", run(enginePanicLetsTheRetryRun)},
				{"SealedReplay", run(engineSealedReplay)},
				{"SealRotation", run(engineSealRotation)},
				{"SealKeyMissingNeverRunsAgain", run(engineSealKeyMissing)},
				{"SealBrokenNeverRunsAgain", run(engineSealBroken)},
				{"SealDowngradeRefused", run(engineSealDowngrade)},
				{"SealTagBindsColumns", run(engineSealTagBindsColumns)},
				{"SealFormat1StillOpens", run(engineSealFormat1StillOpens)},
				{"SealedStormLeavesNoPlainText", run(engineSealedStorm)},
				{"DamagedNeverRuns", run(engineDamagedNeverRuns)},
			}
			if mode.oneCommit {
				cases = append(cases,
					suiteCase{"NothingCommittedWhileFnRuns", engineNothingCommittedWhileFnRuns},
					suiteCase{"WaitBoundGivesInFlight", engineWaitBoundGivesInFlight})
			}
			runCases(t, h, append(cases, waitCases(run, mode.oneCommit, h.SingleWriter)...))
		})
	}
}

// newEngine returns an engine on a fresh driver of h in the mode asked
// (skipping t when the driver has no one-commit mode), and the driver.
func newEngine(t *testing.T, h Harness, oneCommit bool, cfg idem.EngineOptions) (*idem.Engine, idemdriver.Driver) {
	t.Helper()
	d := h.NewDriver(t)
	if _, ok := d.(idemdriver.TxClaimer); oneCommit && !ok {
		t.Skipf("%T does not implement idemdriver.TxClaimer", d)
	}
	cfg.OneCommit.Enabled, cfg.Logger = oneCommit, slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := idem.NewEngineWith(d, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	return g, d
}

// counted is a Do fn that counts its runs and answers 201 with body.
func counted(runs *atomic.Int32, body string) func(context.Context) (idem.Result, error) {
	return func(context.Context) (idem.Result, error) {
		runs.Add(1)
		return idem.Result{Status: 201, Body: []byte(body)}, nil
	}
}

func doParams(key, payload string) idem.DoParams {
	return idem.DoParams{Scope: "acct", Key: key, Route: "orders", Payload: []byte(payload)}
}

func engineRunsOnceThenReplays(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{})
	var runs atomic.Int32
	first, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "one"))
	require.NoError(t, err)
	again, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "two"))
	require.NoError(t, err)
	require.Equal(t, first.Status, again.Status)
	require.Equal(t, first.Body, again.Body, "the stored Result, byte for byte")
	require.EqualValues(t, 1, runs.Load())
	_, err = g.Do(t.Context(), doParams("k", "b"), counted(&runs, "three"))
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.EqualValues(t, 1, runs.Load())
}

// An error from fn is recorded Failed even under an Outcome that stores
// every status (a Stripe-like policy that replays 5xx): the retry runs fn
// again and its success is the one replayed.
func engineErrorIsNeverASuccess(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Response: idem.ResponseOptions{Outcome: func(int) idem.Outcome { return idem.Succeeded }}})
	declined := errors.New("declined")
	var runs atomic.Int32
	_, err := g.Do(t.Context(), doParams("k", "a"), func(context.Context) (idem.Result, error) {
		runs.Add(1)
		return idem.Result{}, declined
	})
	require.ErrorIs(t, err, declined, "fn's own error")
	rec, err := d.Get(t.Context(), idemdriver.GetParams{Scope: "acct", Key: "k"})
	if oneCommit {
		require.ErrorIs(t, err, idemdriver.ErrNotFound, "the rollback leaves no record")
	} else {
		require.NoError(t, err)
		require.Equal(t, idemdriver.StateFailed, rec.State)
	}
	out, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "ok"))
	require.NoError(t, err)
	require.Equal(t, "ok", string(out.Body))
	require.EqualValues(t, 2, runs.Load(), "the retry ran fn again")
	out, err = g.Do(t.Context(), doParams("k", "a"), counted(&runs, "again"))
	require.NoError(t, err)
	require.Equal(t, "ok", string(out.Body), "the success is replayed, never the error")
	require.EqualValues(t, 2, runs.Load())
}

// Duplicates racing one new key: fn runs once; every other call gets its
// replay or ErrInFlight, never another run nor another error.
func engineConcurrentDuplicatesRunOnce(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{})
	var runs atomic.Int32
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([]idem.Result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = g.Do(context.Background(), doParams("k", "a"), counted(&runs, "one"))
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, runs.Load())
	for i, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, idem.ErrInFlight, "call %d", i)
			continue
		}
		require.Equal(t, "one", string(outs[i].Body), "call %d", i)
	}
}

// A burst of retries of a completed key is replayed, every one: never
// ErrInFlight, whatever the load.
func engineBurstOfACompletedKeyReplays(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{})
	var runs atomic.Int32
	_, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "one"))
	require.NoError(t, err)
	const n = 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := g.Do(context.Background(), doParams("k", "a"), counted(&runs, "two"))
			if err == nil && string(out.Body) != "one" {
				err = fmt.Errorf("replayed %q", out.Body)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "call %d", i)
	}
	require.EqualValues(t, 1, runs.Load())
}

// fn's business write commits with the outcome, once; a failed fn's write
// rolls back with it.
func engineBusinessWriteCommitsWithOutcome(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{})
	biz := h.Business(t, d)
	write := func(id string, fail bool) func(context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			tx, err := idem.Tx[any](ctx)
			if err == nil {
				err = biz.Insert(ctx, tx, id)
			}
			if err == nil && fail {
				err = errors.New("declined")
			}
			return idem.Result{Status: 201}, err
		}
	}
	_, err := g.Do(t.Context(), doParams("f", "a"), write("row-f", true))
	require.Error(t, err)
	require.Zero(t, rows(t, biz, "row-f"), "a failed fn's write rolled back")
	_, err = g.Do(t.Context(), doParams("k", "a"), write("row-k", false))
	require.NoError(t, err)
	_, err = g.Do(t.Context(), doParams("k", "a"), write("row-k", false))
	require.NoError(t, err)
	require.Equal(t, 1, rows(t, biz, "row-k"))
}

// A panic in fn is raised again, and the retry runs at once (no lease, or
// no record, holds the key).
func enginePanicLetsTheRetryRun(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, _ := newEngine(t, h, oneCommit, idem.EngineOptions{})
	var runs atomic.Int32
	require.PanicsWithValue(t, "boom", func() {
		_, _ = g.Do(t.Context(), doParams("k", "a"), func(context.Context) (idem.Result, error) {
			runs.Add(1)
			panic("boom")
		})
	})
	_, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "ok"))
	require.NoError(t, err)
	require.EqualValues(t, 2, runs.Load())
}

// One-commit Do: while fn runs, another connection sees no record of the
// key (a crash there leaves nothing: the retry runs at once).
func engineNothingCommittedWhileFnRuns(t *testing.T, h Harness) {
	t.Parallel()
	g, d := newEngine(t, h, true, idem.EngineOptions{})
	var seen error
	_, err := g.Do(t.Context(), doParams("k", "a"), func(ctx context.Context) (idem.Result, error) {
		_, seen = d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
		return idem.Result{Status: 201}, nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, seen, idemdriver.ErrNotFound, "the claim is not committed while fn runs")
	rec, err := d.Get(t.Context(), idemdriver.GetParams{Scope: "acct", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
}

// One-commit Do: a duplicate of a key whose fn runs waits at most
// OneCommit.Wait, in this process or (another engine, as another process)
// on the row lock, then gets ErrInFlight; once fn committed it gets the
// replay. A single-writer store queues it for the write lock instead.
func engineWaitBoundGivesInFlight(t *testing.T, h Harness) {
	t.Parallel()
	cfg := idem.EngineOptions{OneCommit: idem.OneCommitOptions{Wait: 100 * time.Millisecond}}
	g, d := newEngine(t, h, true, cfg)
	cfg.OneCommit.Enabled = true
	other, err := idem.NewEngineWith(d, cfg)
	require.NoError(t, err)
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		for {
			_, err := g.Do(context.Background(), doParams("k", "a"), func(context.Context) (idem.Result, error) {
				runs.Add(1)
				close(started)
				<-release
				return idem.Result{Status: 201, Body: []byte("one")}, nil
			})
			// A claim that did not answer in time on a loaded machine, or
			// whose lock wait (OneCommit.Wait, 100 ms, for any lock: on a
			// partitioned table another case's partition DDL can hold the
			// table's that long, seen in CI) ran out (fn not run, and no
			// other call of this key exists yet): retried, as a client would.
			if (errors.Is(err, idem.ErrStoreUnavailable) || errors.Is(err, idem.ErrInFlight)) && runs.Load() == 0 {
				continue
			}
			first <- err
			return
		}
	}()
	select {
	case <-started:
	case err := <-first:
		t.Fatalf("the first Do returned without running fn: %v", err)
	}
	if !h.SingleWriter {
		for _, e := range []*idem.Engine{g, other} {
			_, err := e.Do(t.Context(), doParams("k", "a"), counted(&runs, "two"))
			var inFlight *idem.InFlightError
			require.ErrorAs(t, err, &inFlight)
			require.GreaterOrEqual(t, inFlight.RetryAfter, time.Second)
		}
	}
	dup := make(chan error, 1)
	go func() {
		out, err := g.Do(context.Background(), doParams("k", "a"), counted(&runs, "two"))
		if err == nil && string(out.Body) != "one" {
			err = fmt.Errorf("replayed %q", out.Body)
		}
		dup <- err
	}()
	close(release)
	require.NoError(t, <-first)
	if err := <-dup; !errors.Is(err, idem.ErrInFlight) {
		require.NoError(t, err, "a duplicate gets the replay or, while fn still runs, ErrInFlight")
	}
	// The claim's lock wait is OneCommit.Wait (100 ms) for any lock, the
	// table's too: on a partitioned table another case's partition DDL can
	// hold it that long on a loaded machine (seen in CI), answered
	// ErrInFlight. A client retries; fn never runs again.
	out, err := g.Do(t.Context(), doParams("k", "a"), counted(&runs, "three"))
	for tries := 0; errors.Is(err, idem.ErrInFlight) && tries < 100; tries++ {
		time.Sleep(10 * time.Millisecond)
		out, err = g.Do(t.Context(), doParams("k", "a"), counted(&runs, "three"))
	}
	require.NoError(t, err)
	require.Equal(t, "one", string(out.Body))
	require.EqualValues(t, 1, runs.Load())
}
