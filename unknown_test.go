package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
)

var errTimeout = errors.New("the bank did not answer in 30s")

// An at-most-once step whose call ends uncertain makes the record UNKNOWN:
// the first caller and every retry get ErrOutcomeUnknown, nothing runs
// again, and a new key is not said to be safe.
func TestAtMostOnceUncertainIsHeldUnknown(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	var jobs, transfers int
	fn := func(ctx context.Context) (idem.Result, error) {
		jobs++
		_, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) {
			transfers++
			return "", errTimeout
		}, idem.AtMostOnce())
		if err != nil {
			return idem.Result{Status: 504}, err
		}
		return idem.Result{Status: 201}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	rep, err := g.DoReport(t.Context(), p, fn)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	var uerr *idem.UnknownError
	require.ErrorAs(t, err, &uerr)
	require.Equal(t, "transfer", uerr.Step)
	require.Equal(t, idemdriver.ReasonStepUncertain, uerr.Reason)
	require.ErrorIs(t, err, errTimeout, "the cause")
	require.False(t, rep.NewKeySafe)

	rec := record(t, d, "s", "k")
	require.Equal(t, idemdriver.StateUnknown, rec.State)
	require.Nil(t, rec.LockedUntil)
	for range 3 {
		rep, err = g.DoReport(t.Context(), p, fn)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.False(t, rep.NewKeySafe)
		require.False(t, idem.NewKeySafe(err))
	}
	require.Equal(t, 1, jobs, "never run again")
	require.Equal(t, 1, transfers)
}

// deadOwner claims (scope "s", key "k", Do's payload p) an hour ago under a
// lease long run out and starts the step name at-most-once, as a process
// that died during the call leaves it.
func deadOwner(t *testing.T, d *idemsqlite.Driver, payload, name string) idemdriver.Record {
	t.Helper()
	return deadOwnerAgo(t, d, payload, name, time.Hour)
}

// deadOwnerAgo is deadOwner whose claim and step started ago (the
// database's clock moved back by ago; its one-second lease long over).
func deadOwnerAgo(t *testing.T, d *idemsqlite.Driver, payload, name string, ago time.Duration) idemdriver.Record {
	t.Helper()
	fp := sha256.Sum256([]byte(payload))
	res, err := d.Claim(t.Context(), idemdriver.ClaimParams{Scope: "s", Key: "k", Method: "DO", Fingerprint: fp[:],
		LeaseDuration: time.Second, Retention: 24 * time.Hour, ClockOffset: -ago})
	require.NoError(t, err)
	rec := res.Record
	_, err = d.StartStep(t.Context(), idemdriver.StartStepParams{StepParams: idemdriver.StepParams{Scope: "s", Key: "k",
		CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: name, ClockOffset: -ago},
		Relay: []byte("r"), AtMostOnce: true})
	require.NoError(t, err)
	return rec
}

// A callee may still act on a call its caller gave up on (a queued
// transfer): with SettlesWithin, a not-applied answer about a start younger
// than the bound holds the step (never run), one about an older start runs
// it, and an applied answer is believed at once. Found by a fresh user: a
// transfer the bank made 12 s after its caller died, while the retry's
// reconcile had been told "no such transfer" at 6 s and ran it again.
func TestSettlesWithinHoldsAYoungNotApplied(t *testing.T) {
	t.Parallel()
	notApplied := func(context.Context, string) (string, error) {
		return "", idem.StepNotApplied(errors.New("the bank has no such transfer"))
	}
	applied := func(context.Context, string) (string, error) { return "tr_found", nil }
	for _, tc := range []struct {
		name      string
		ago       time.Duration // the earlier start's age
		settle    time.Duration
		reconcile func(context.Context, string) (string, error)
		runs      int
		want      string // the body, or "held"
	}{
		{"not-applied-too-young", 2 * time.Second, time.Minute, notApplied, 0, "held"},
		{"not-applied-settled", 2 * time.Minute, time.Minute, notApplied, 1, "tr_new"},
		{"applied-while-young", 2 * time.Second, time.Minute, applied, 0, "tr_found"},
		{"no-bound", 2 * time.Second, 0, notApplied, 1, "tr_new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, d := newEngine(t, nil, idem.EngineOptions{})
			deadOwnerAgo(t, d, "p", "transfer", tc.ago)
			runs := 0
			out, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("p")}, func(ctx context.Context) (idem.Result, error) {
				id, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) { runs++; return "tr_new", nil },
					idem.AtMostOnce(), idem.Reconcile(tc.reconcile), idem.SettlesWithin(tc.settle))
				return idem.Result{Body: []byte(id)}, err
			})
			require.Equal(t, tc.runs, runs, "the step ran")
			if tc.want == "held" {
				require.ErrorIs(t, err, idem.ErrStepUnreconciled)
				require.ErrorContains(t, err, "SettlesWithin 1m0s")
				require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State, "held FAILED: the next re-execution asks again")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, string(out.Body))
		})
	}
	t.Run("negative", func(t *testing.T) {
		t.Parallel()
		g, _ := newEngine(t, nil, idem.EngineOptions{})
		_, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			_, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) { return "", nil }, idem.SettlesWithin(-time.Second))
			return idem.Result{}, err
		})
		require.ErrorContains(t, err, "SettlesWithin -1s is negative")
	})
}

// A takeover that finds an at-most-once step started without a result never
// runs it: with no reconcile function the record becomes UNKNOWN; with one,
// its answer decides: applied gives the result, not applied runs the step,
// still unknown holds the record.
func TestAtMostOnceAfterADeadOwner(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		reconcile func(context.Context, string) (string, error)
		runs      int
		want      string
	}{
		{"no-reconcile", nil, 0, ""},
		{"applied", func(_ context.Context, relay string) (string, error) { return "tr_found_" + relay[:4], nil }, 0, "tr_found_"},
		{"not-applied", func(context.Context, string) (string, error) {
			return "", idem.StepNotApplied(errors.New("the bank has no such transfer"))
		}, 1, "tr_new"},
		{"cannot-tell", func(context.Context, string) (string, error) { return "", errors.New("the bank's API is down") }, 0, "unreconciled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, d := newEngine(t, nil, idem.EngineOptions{})
			deadOwner(t, d, "p", "transfer")
			runs, reconciled := 0, 0
			var opts []idem.StepOption
			opts = append(opts, idem.AtMostOnce())
			if tc.reconcile != nil {
				opts = append(opts, idem.Reconcile(func(ctx context.Context, relay string) (string, error) {
					reconciled++
					return tc.reconcile(ctx, relay)
				}))
			}
			out, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("p")}, func(ctx context.Context) (idem.Result, error) {
				id, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) { runs++; return "tr_new", nil }, opts...)
				return idem.Result{Body: []byte(id)}, err
			})
			require.Equal(t, tc.runs, runs, "the step ran")
			if tc.want == "unreconciled" {
				require.ErrorIs(t, err, idem.ErrStepUnreconciled)
				require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State, "held FAILED: the next re-execution asks again")
				return
			}
			if tc.want == "" {
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				require.Equal(t, idemdriver.StateUnknown, record(t, d, "s", "k").State)
				return
			}
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(out.Body), tc.want), "%s", out.Body)
			require.Equal(t, 1, reconciled)
			require.Equal(t, idemdriver.StateSucceeded, record(t, d, "s", "k").State)
		})
	}
}

// Behind the middleware the first caller gets the same 409 as every retry,
// whatever the handler wrote: outcome-unknown, no Retry-After, new_key_safe
// false.
func TestOutcomeUnknownAnswersEveryCaller(t *testing.T) {
	t.Parallel()
	runs := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		_, err := idem.Step(r.Context(), "sms", func(context.Context) (bool, error) { return false, errTimeout }, idem.AtMostOnce())
		if err != nil {
			http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	mw := newMiddleware(t, nil, idem.Options{})
	for i := range 3 {
		res := send(mw.Handler(h), "POST", "/v1/sms", "key-1", `{"to":"+15551234"}`)
		require.Equal(t, http.StatusConflict, res.Code, "call %d", i)
		require.Empty(t, res.Header().Get("Retry-After"), "call %d", i)
		var pr map[string]any
		require.NoError(t, json.Unmarshal(res.Body.Bytes(), &pr))
		require.Equal(t, idem.ProblemTypeBase+"outcome-unknown", pr["type"])
		require.Equal(t, false, pr["new_key_safe"])
	}
	require.Equal(t, 1, runs)
}

// An operator's resolution ends the UNKNOWN record: applied, the next
// request resumes with the given result and the step does not run; not
// applied, it runs.
func TestResolvedUnknownResumes(t *testing.T) {
	t.Parallel()
	for _, applied := range []bool{true, false} {
		g, d := newEngine(t, nil, idem.EngineOptions{})
		runs := 0
		uncertain := true
		fn := func(ctx context.Context) (idem.Result, error) {
			id, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) {
				runs++
				if uncertain {
					return "", errTimeout
				}
				return "tr_2", nil
			}, idem.AtMostOnce())
			return idem.Result{Body: []byte(id)}, err
		}
		p := idem.DoParams{Scope: "s", Key: "k"}
		_, err := g.Do(t.Context(), p, fn)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		rec := record(t, d, "s", "k")
		rp := idemdriver.ResolveStepParams{StepParams: idemdriver.StepParams{Scope: "s", Key: "k", CreatedAt: rec.CreatedAt,
			FencingToken: rec.FencingToken, Name: "transfer"}, Applied: applied, By: "ops", Why: "statement", Retention: time.Hour}
		if applied {
			rp.Result, err = idem.EncodeStepResult("tr_1")
			require.NoError(t, err)
		}
		require.NoError(t, d.ResolveStep(t.Context(), rp))
		uncertain = false
		out, err := g.Do(t.Context(), p, fn)
		require.NoError(t, err, "applied %v", applied)
		if applied {
			require.Equal(t, "tr_1", string(out.Body))
			require.Equal(t, 1, runs)
		} else {
			require.Equal(t, "tr_2", string(out.Body))
			require.Equal(t, 2, runs)
		}
	}
}

// A duplicate sent in wait mode (Waiting.Wait) while the owner's
// at-most-once step runs, which then ends uncertain, is answered
// outcome-unknown too (whether it waited for the owner's end or read the
// record after it), and the handler ran once.
func TestOutcomeUnknownAnswersAWaitingDuplicate(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		_, err := idem.Step(r.Context(), "sms", func(context.Context) (bool, error) {
			close(entered)
			<-release
			return false, errTimeout
		}, idem.AtMostOnce())
		http.Error(w, err.Error(), http.StatusGatewayTimeout)
	})
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Minute}}})
	first := make(chan int)
	go func() { first <- send(mw.Handler(h), "POST", "/v1/sms", "key-1", `{}`).Code }()
	<-entered
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- send(mw.Handler(h), "POST", "/v1/sms", "key-1", `{}`) }()
	close(release)
	require.Equal(t, http.StatusConflict, <-first)
	res := <-second
	require.Equal(t, http.StatusConflict, res.Code)
	require.Contains(t, res.Body.String(), "outcome-unknown")
	require.EqualValues(t, 1, runs.Load())
}

// bank is an at-most-once transfer whose call times out, and whose
// reconcile function cannot tell until the bank knows.
type bank struct {
	transfers, asked int
	knows            bool
}

// transfer runs the transfer step under ctx.
func (b *bank) transfer(ctx context.Context) (string, error) {
	return idem.Step(ctx, "transfer", func(context.Context) (string, error) {
		b.transfers++
		return "", errTimeout
	}, idem.AtMostOnce(), idem.Reconcile(func(_ context.Context, relay string) (string, error) {
		b.asked++
		if !b.knows {
			return "", errors.New("the bank's statement is not out yet")
		}
		return "tr_" + relay[:6], nil
	}))
}

// Over HTTP, a held execution is answered 503 step-unreconciled whatever
// its handler wrote: a fresh user's handler ignored ErrStepUnreconciled
// and answered 201, which the client took for done while the record was
// FAILED and a later retry answered another 201.
func TestHeldStepIsAnswered503(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	var b bank
	mw := newMiddleware(t, d, idem.Options{})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := b.transfer(r.Context())
		_ = err // ignored: the handler answers 201 anyway
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(id))
	}))
	for range 2 {
		got := send(h, "POST", "/transfers", "k", `{}`)
		require.Equal(t, http.StatusServiceUnavailable, got.Code, "body: %s", got.Body)
		require.Contains(t, got.Body.String(), idem.ProblemTypeBase+"step-unreconciled")
		require.Equal(t, "1", got.Header().Get("Retry-After"))
		require.Equal(t, idemdriver.StateFailed, record(t, d, idem.SingleTenantScope, "k").State)
	}
	b.knows = true
	got := send(h, "POST", "/transfers", "k", `{}`)
	require.Equal(t, http.StatusCreated, got.Code)
	require.True(t, strings.HasPrefix(got.Body.String(), "tr_"), "%s", got.Body)
	require.Equal(t, 1, b.transfers, "the transfer ran once")
	require.Equal(t, 2, b.asked)
}

// An at-most-once step with a reconcile function whose call times out is
// held, its execution FAILED whatever the handler answers; the next
// re-executions ask the reconcile function, never running the step, until
// it tells: here, once it can, that the transfer happened.
func TestReconcileAfterATimeout(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	var b bank
	fn := func(ctx context.Context) (idem.Result, error) {
		id, err := b.transfer(ctx)
		if err != nil {
			return idem.Result{Status: 200}, nil // a handler that answers 200 anyway
		}
		return idem.Result{Status: 201, Body: []byte(id)}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	for range 2 {
		_, err := g.Do(t.Context(), p, fn)
		require.ErrorIs(t, err, idem.ErrOutcomeFailed, "recorded FAILED, whatever the handler answered")
		require.ErrorIs(t, err, idem.ErrStepUnreconciled, "and why")
		require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State)
	}
	b.knows = true
	out, err := g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, 201, out.Status)
	require.Equal(t, 1, b.transfers, "the transfer ran once")
	require.Equal(t, 2, b.asked, "asked by each re-execution")
}
