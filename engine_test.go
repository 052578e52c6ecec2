package idem_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
)

func newEngine(t *testing.T, store idem.Store, cfg idem.EngineOptions) (*idem.Engine, *idemsqlite.Driver) {
	t.Helper()
	d := openSQLite(t)
	if store == nil {
		store = d
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	g, err := idem.NewEngineWith(store, cfg)
	require.NoError(t, err)
	return g, d
}

// Do runs fn once per (scope, key) and replays the recorded Result.
func TestDoOnceAndReplay(t *testing.T) {
	t.Parallel()
	obs := &events{}
	g, _ := newEngine(t, nil, idem.EngineOptions{Observer: obs})
	runs := 0
	fn := func(ctx context.Context) (idem.Result, error) {
		runs++
		ex, ok := idem.ExecutionFromContext(ctx)
		require.True(t, ok)
		require.Equal(t, 1, ex.Attempt)
		return idem.Result{Body: []byte("charged"), Header: map[string][]string{"X-Id": {"1"}}}, nil
	}
	p := idem.DoParams{Scope: "orders", Key: "msg-1", Payload: []byte(`{"n":1}`), Route: "orders.created"}
	for range 3 {
		out, err := g.Do(t.Context(), p, fn)
		require.NoError(t, err)
		require.Equal(t, "charged", string(out.Body))
		require.Equal(t, []string{"1"}, out.Header["X-Id"])
	}
	require.Equal(t, 1, runs)
	evs := obs.take()
	require.Len(t, evs, 3)
	require.Equal(t, idem.EventExecuted, evs[0].Kind)
	require.Equal(t, idem.EventReplayed, evs[1].Kind)
	require.Equal(t, "orders.created", evs[0].Route)
	require.Equal(t, "DO", evs[0].Method)

	// Another payload under the key: key reused, fn not run.
	p.Payload = []byte(`{"n":2}`)
	_, err := g.Do(t.Context(), p, fn)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.EqualError(t, err, `idem: Idempotency-Key reused with a different request: the key was first used for DO "orders.created" with another payload or operation`)
	require.Equal(t, 1, runs)
}

// Concurrent duplicates: one execution; the others are told in flight
// (with a Retry-After) or get the replay.
func TestDoConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	fn := func(ctx context.Context) (idem.Result, error) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return idem.Result{Status: 201, Body: []byte("ok")}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := g.Do(context.Background(), p, fn)
		require.NoError(t, err)
	}()
	<-started
	var inFlight int
	for range 5 {
		_, err := g.Do(t.Context(), p, fn)
		var ife *idem.InFlightError
		require.ErrorAs(t, err, &ife)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.GreaterOrEqual(t, ife.RetryAfter, time.Second)
		inFlight++
	}
	close(release)
	wg.Wait()
	out, err := g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, 201, out.Status)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 5, inFlight)
}

// An error from fn is recorded FAILED: returned as is, and the next call
// runs fn again (attempt 2).
func TestDoErrorRunsAgain(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	boom := errors.New("provider down")
	var attempts []int
	fn := func(ctx context.Context) (idem.Result, error) {
		ex, _ := idem.ExecutionFromContext(ctx)
		attempts = append(attempts, ex.Attempt)
		if len(attempts) == 1 {
			return idem.Result{}, boom
		}
		return idem.Result{Body: []byte("ok")}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err := g.Do(t.Context(), p, fn)
	require.ErrorIs(t, err, boom)
	require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State)
	out, err := g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, "ok", string(out.Body))
	require.Equal(t, []int{1, 2}, attempts)
}

// fn's business writes go in the claim's transaction (idem.Tx[*sql.Tx]), and
// commit with the outcome; an error rolls them back.
func TestDoWritesInTheClaimsTransaction(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	_, err := d.DB().Exec(`CREATE TABLE effects (id TEXT)`)
	require.NoError(t, err)
	write := func(fail bool) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			tx, err := idem.Tx[*sql.Tx](ctx)
			if err != nil {
				return idem.Result{}, err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ('x')`); err != nil {
				return idem.Result{}, err
			}
			if fail {
				return idem.Result{}, errors.New("rolled back")
			}
			return idem.Result{Body: []byte("done")}, nil
		}
	}
	count := func() (n int) {
		require.NoError(t, d.DB().QueryRow(`SELECT count(*) FROM effects`).Scan(&n))
		return n
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err = g.Do(t.Context(), p, write(true))
	require.Error(t, err)
	require.Zero(t, count(), "fn's error rolled its writes back")
	_, err = g.Do(t.Context(), p, write(false))
	require.NoError(t, err)
	_, err = g.Do(t.Context(), p, write(false))
	require.NoError(t, err)
	require.Equal(t, 1, count(), "one effect, committed with the outcome")
}

// A released execution records nothing: ErrReleased with fn's Result, and
// the next call runs fn again whatever its payload.
func TestDoReleased(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	runs := 0
	fn := func(ctx context.Context) (idem.Result, error) {
		runs++
		if runs == 1 {
			require.NoError(t, idem.ReleaseKey(ctx))
			return idem.Result{Status: 400}, nil
		}
		return idem.Result{Status: 200}, nil
	}
	out, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("bad")}, fn)
	require.ErrorIs(t, err, idem.ErrReleased)
	require.Equal(t, 400, out.Status)
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("good")}, fn)
	require.NoError(t, err)
	require.Equal(t, 2, runs)
}

// A dead owner's key is taken over (attempt 2, event taken over); a closed
// store is ErrStoreUnavailable and fn does not run; bad params are refused.
func TestDoTakeOverStoreAndParams(t *testing.T) {
	t.Parallel()
	obs := &events{}
	g, d := newEngine(t, nil, idem.EngineOptions{Observer: obs})
	p := idem.DoParams{Scope: "s", Key: "k", Payload: []byte("p")}
	_, err := d.Claim(t.Context(), idemdriver.ClaimParams{Scope: "s", Key: "k", Method: "DO", Path: "",
		Fingerprint: sha(p.Payload), LeaseDuration: time.Second, Retention: 24 * time.Hour, ClockOffset: -time.Hour})
	require.NoError(t, err)
	runs := 0
	fn := func(ctx context.Context) (idem.Result, error) { runs++; return idem.Result{}, nil }
	_, err = g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, 2, obs.takeOne(t, idem.EventTakenOver).Attempt)

	for _, bad := range []idem.DoParams{{Scope: "s"}, {Scope: "s", Key: "a b"}, {Key: "k"}, {Scope: "s\x00", Key: "k"},
		{Scope: "s", Key: "k", Fingerprint: []byte("short")}} {
		_, err := g.Do(t.Context(), bad, fn)
		require.Error(t, err, "%+v", bad)
	}
	// Regression (a new user's try): ParseKey's trimming let a key with
	// spaces around it through, stored as sent: " k" and "k" were two keys.
	for _, key := range []string{" k", "k\t", `"k"`, strings.Repeat("z", idem.MaxKeyLength) + "  "} {
		_, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: key}, fn)
		require.ErrorIs(t, err, idem.ErrInvalidKey, "%q", key)
	}
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, fn)
	require.NotErrorIs(t, err, idem.ErrInvalidKey)

	require.NoError(t, d.Close())
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k2"}, fn)
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, 1, runs)
}

// A panicking fn is recorded FAILED and its panic raised again.
func TestDoPanic(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	require.PanicsWithValue(t, "boom", func() {
		_, _ = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, func(context.Context) (idem.Result, error) { panic("boom") })
	})
	require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State)
}

// The middleware's engine shares its store and Config.
func TestMiddlewareEngine(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t, nil, idem.Options{})
	out, err := mw.Engine().Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, func(context.Context) (idem.Result, error) {
		return idem.Result{Body: []byte("x")}, nil
	})
	require.NoError(t, err)
	require.Equal(t, "x", string(out.Body))
	_, err = idem.NewEngineWith(nil, idem.EngineOptions{})
	require.Error(t, err, "a Store is still required")
}

func sha(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

// Regression (a new user's try): a Result whose status the policy records
// FAILED came back with a nil error, so a consumer that acks on a nil error
// acked work the next call runs again.
func TestDoFailedOutcomeIsAnError(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	runs := 0
	fn := func(context.Context) (idem.Result, error) {
		runs++
		return idem.Result{Status: 503, Body: []byte("later")}, nil
	}
	for range 2 {
		out, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, fn)
		require.ErrorIs(t, err, idem.ErrOutcomeFailed)
		require.Equal(t, 503, out.Status, "fn's Result comes with the error")
	}
	require.Equal(t, 2, runs, "nothing was replayed")
}

// Regression (a fresh user's try): a nil function panicked inside Do after
// its record was claimed, and the record was left FAILED.
func TestDoNeedsAFunction(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	_, err := g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "k"}, nil)
	require.ErrorContains(t, err, "Do needs a function")
	_, err = d.Get(context.Background(), idemdriver.GetParams{Scope: "s", Key: "k"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "nothing claimed")
}

// Regression (a fresh user's try): MariaDB answered a 256-byte method
// ErrScopeUnstorable, blaming the scope; SQLite and PostgreSQL took it.
func TestDoMethodLength(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	ok := func(context.Context) (idem.Result, error) { return idem.Result{Status: 200}, nil }
	_, err := g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "k", Method: strings.Repeat("M", 256)}, ok)
	require.ErrorContains(t, err, "at most MaxMethodLength (255)")
	require.NotErrorIs(t, err, idem.ErrScopeUnstorable)
	_, err = g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "k", Method: strings.Repeat("M", 255)}, ok)
	require.NoError(t, err)
}

// Regression (a fresh user's try): a function that returned Step's
// UNKNOWN error got it back from Do twice over, joined.
func TestDoReturnsAStepsUnknownOnce(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	_, err := g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "sms", func(context.Context) (string, error) { return "", errors.New("the gateway timed out") }, idem.AtMostOnce())
		return idem.Result{}, err
	})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 1, strings.Count(err.Error(), "cannot be known"), err.Error())
}
