package completer_test

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/completer"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/adaptertest"
	"github.com/idemgo/idem/seal"
)

type merchantKey struct{}

// stores are the databases the completer is tested on: adaptertest's
// (migrated SQLite and PostgreSQL) and PostgreSQL's partitioned table.
var stores = map[string]func(t *testing.T) idem.Store{
	"sqlite":               adaptertest.SQLite,
	"postgres":             adaptertest.Postgres,
	"postgres-partitioned": adaptertest.PostgresPartitioned,
}

// shop is a payments API behind idem whose merchant comes from its
// authentication (a context value), with a provider that honours keys and
// a ledger whose write fails while failWrites is set.
type shop struct {
	store      idemdriver.Driver
	mw         *idem.Middleware
	protected  http.Handler
	runs       atomic.Int32
	charges    sync.Map // relayed key -> charge
	calls      atomic.Int32
	failWrites atomic.Bool
	ledger     sync.Map // key -> charge
	mu         sync.Mutex
	seen       []string // per run: its X-Signature, Authorization, query and Content-Type
}

func newShop(t *testing.T, store idemdriver.Driver, keep bool, keys []seal.Key) *shop {
	t.Helper()
	s := &shop{store: store}
	mw, err := idem.NewMiddleware(store, idem.Options{
		Scope: func(r *http.Request) (string, error) {
			m, _ := r.Context().Value(merchantKey{}).(string)
			return m, nil
		},
		Request: idem.RequestOptions{KeepForRedrive: keep, Redact: func(h http.Header) { h.Del("X-Signature") }},
		Engine:  idem.EngineOptions{Logger: slog.New(slog.DiscardHandler), Sealing: idem.SealingOptions{Keys: keys}},
	})
	require.NoError(t, err)
	s.mw = mw
	s.protected = mw.Handler(http.HandlerFunc(s.pay))
	return s
}

func (s *shop) pay(w http.ResponseWriter, r *http.Request) {
	s.runs.Add(1)
	s.mu.Lock()
	s.seen = append(s.seen, r.Header.Get("X-Signature")+"|"+r.Header.Get("Authorization")+"|"+r.URL.RawQuery+"|"+r.Header.Get("Content-Type"))
	s.mu.Unlock()
	charge, err := idem.Step(r.Context(), "charge", func(ctx context.Context) (string, error) {
		relay, err := idem.RelayKey(ctx, "charge")
		s.calls.Add(1)
		c, _ := s.charges.LoadOrStore(relay, "ch_"+relay[:8])
		return c.(string), err
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if s.failWrites.Load() {
		http.Error(w, "the ledger write failed", http.StatusInternalServerError)
		return
	}
	s.ledger.Store(r.Header.Get(idem.HeaderKey), charge)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(charge))
}

// send is a client's request for merchant with key: authenticated by the
// server's chain (here: the merchant in the context).
func (s *shop) send(merchant, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/v1/payments?currency=jpy", strings.NewReader(`{"amount":500}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("X-Signature", "sig")
	req.Header.Set(idem.HeaderKey, key)
	req = req.WithContext(context.WithValue(req.Context(), merchantKey{}, merchant))
	w := httptest.NewRecorder()
	s.protected.ServeHTTP(w, req)
	return w
}

func (s *shop) completer(t *testing.T, cfg completer.Config) *completer.Completer {
	t.Helper()
	cfg.Handler = s.protected
	cfg.Context = func(ctx context.Context, scope string) (context.Context, error) {
		return context.WithValue(ctx, merchantKey{}, scope), nil
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := completer.New(s.store, cfg)
	require.NoError(t, err)
	return c
}

// cycle runs one cycle of c and waits for its re-drives.
func cycle(t *testing.T, c *completer.Completer) {
	t.Helper()
	require.NoError(t, c.Cycle(context.Background()))
	c.Wait()
}

func onStores(t *testing.T, f func(t *testing.T, store func(t *testing.T) idem.Store)) {
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, store)
		})
	}
}

// A payment charged whose ledger write failed (500, FAILED), its client
// gone: the completer re-drives it once its grace is over; the charge
// step's recorded result is booked without calling the provider again, the
// late retry gets the replay. A FAILED record without a started step is
// never started anew.
func TestCompleterFinishesAnAbandonedPayment(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		for _, sealed := range []bool{false, true} {
			var keys []seal.Key
			if sealed {
				keys = []seal.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}
			}
			s := newShop(t, store(t), true, keys)
			s.failWrites.Store(true)
			require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
			require.Equal(t, int32(1), s.calls.Load())

			c := s.completer(t, completer.Config{Keys: keys, Grace: 1}) // 1 ns: due at once
			s.failWrites.Store(false)
			cycle(t, c)
			got, ok := s.ledger.Load("pay-1")
			require.True(t, ok, "sealed %v: booked without its client", sealed)
			require.Equal(t, int32(1), s.calls.Load(), "the provider was not called again")
			require.EqualValues(t, 1, c.Stats().Finished)
			require.Equal(t, []string{"sig|Bearer secret|currency=jpy|application/json", "||currency=jpy|application/json"}, s.seen,
				"the re-drive has the query and media type, neither the credentials nor the redacted header")

			late := s.send("acme", "pay-1")
			require.Equal(t, http.StatusCreated, late.Code)
			require.Equal(t, "true", late.Header().Get("Idempotent-Replayed"))
			require.Equal(t, got, late.Body.String())

			cycle(t, c)
			require.Equal(t, int32(2), s.runs.Load(), "nothing left to re-drive")
		}
	})
}

func TestCompleterConfig(t *testing.T) {
	t.Parallel()
	_, err := completer.New(adaptertest.SQLite(t), completer.Config{})
	require.ErrorContains(t, err, "Handler and Context are required")
	_, err = completer.New(adaptertest.SQLite(t), completer.Config{Handler: http.NotFoundHandler(),
		Context: func(ctx context.Context, _ string) (context.Context, error) { return ctx, nil }, Grace: -1})
	require.ErrorContains(t, err, "Grace not negative")
}

// After MaxAttempts re-drives the completer ends the execution UNKNOWN.
func TestCompleterGivesUp(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		for _, tc := range []struct {
			name   string
			keep   bool
			reason string
		}{
			{"max-attempts", true, idemdriver.ReasonCompleterGaveUp},
		} {
			s := newShop(t, store(t), tc.keep, nil)
			s.failWrites.Store(true)
			require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
			c := s.completer(t, completer.Config{MaxAttempts: 3, Grace: 1})
			for range 3 {
				cycle(t, c)
				require.Equal(t, idemdriver.StateFailed, record(t, s.store, "pay-1").State, "%s: re-driven, not given up", tc.name)
			}
			require.EqualValues(t, 3, c.Stats().Redriven, tc.name)
			cycle(t, c)
			rec := record(t, s.store, "pay-1")
			require.Equal(t, idemdriver.StateUnknown, rec.State, tc.name)
			steps, err := s.store.(idemdriver.Stepper).Steps(context.Background(), idemdriver.StepParams{Scope: "acme", Key: "pay-1", CreatedAt: rec.CreatedAt})
			require.NoError(t, err)
			reasons := map[string]string{}
			for _, st := range steps {
				reasons[st.Name] = st.Reason
			}
			require.Equal(t, tc.reason, reasons["charge"], tc.name)
			require.Equal(t, int32(1), s.calls.Load(), "%s: one charge", tc.name)
			late := s.send("acme", "pay-1")
			require.Equal(t, http.StatusConflict, late.Code, tc.name)

			// An operator resolves it applied, and the client never comes
			// back: the resolution starts the attempts again, so the
			// completer books the given charge. Regression: the record
			// kept its attempts, and the completer gave up on it again
			// at its next cycle (UNKNOWN, nothing booked).
			resolve(t, s.store, "pay-1", true, `ch_from_the_dashboard`)
			s.failWrites.Store(false)
			cycle(t, c)
			got, ok := s.ledger.Load("pay-1")
			require.True(t, ok, "%s: booked after the resolution", tc.name)
			require.Equal(t, "ch_from_the_dashboard", got)
			require.Equal(t, int32(1), s.calls.Load(), "%s: the provider was not called again", tc.name)
		}
	})
}

// Regression (a fresh user's try): MaxAttempts counted the client's
// attempts, so a client that retried eight 503s (a ledger down) and went
// away left the completer nothing: it held the execution UNKNOWN at its
// first cycle without one re-drive, its charge made and recorded but never
// booked. Its re-drives are now its own.
func TestCompleterRedrivesAfterTheClientsAttempts(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), true, nil)
		s.failWrites.Store(true)
		for range 8 {
			require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
		}
		require.Equal(t, 8, record(t, s.store, "pay-1").Attempts)
		s.failWrites.Store(false) // the ledger is back; the client is gone
		c := s.completer(t, completer.Config{Grace: 1})
		cycle(t, c)
		require.Equal(t, idemdriver.StateSucceeded, record(t, s.store, "pay-1").State)
		_, booked := s.ledger.Load("pay-1")
		require.True(t, booked)
		require.Equal(t, int32(1), s.calls.Load(), "one charge")
		require.Zero(t, c.Stats().GaveUp)
	})
}

// Regression (a second fresh user's try): the re-drives were counted as
// the record's attempts since the completer first found it, so a client
// still retrying between them spent the completer's budget: it re-drove
// once, then held UNKNOWN an execution whose step result was recorded,
// and the client's next retry, which would have succeeded, got 409.
func TestCompleterCountsOnlyItsOwnRedrives(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), true, nil)
		s.failWrites.Store(true)
		require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
		c := s.completer(t, completer.Config{MaxAttempts: 2, Grace: 1})
		cycle(t, c) // re-drive 1: the ledger still fails
		require.EqualValues(t, 1, c.Stats().Redriven)
		for range 5 { // the client still retries
			require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
		}
		s.failWrites.Store(false)
		cycle(t, c) // re-drive 2, not a give-up
		require.Zero(t, c.Stats().GaveUp)
		require.Equal(t, idemdriver.StateSucceeded, record(t, s.store, "pay-1").State)
		require.Equal(t, int32(1), s.calls.Load(), "one charge")
	})
}

// resolve ends key's UNKNOWN record with its charge step applied, result
// its charge (`idem resolve --applied`), or not applied (`--not-applied`).
func resolve(t *testing.T, store idemdriver.Driver, key string, applied bool, charge string) {
	t.Helper()
	ctx := context.Background()
	rec := record(t, store, key)
	result, err := idem.EncodeStepResult(charge)
	require.NoError(t, err)
	require.NoError(t, store.(idemdriver.Stepper).ResolveStep(ctx, idemdriver.ResolveStepParams{
		StepParams: idemdriver.StepParams{Scope: "acme", Key: key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt, Name: "charge"},
		Applied:    applied, Result: result, By: "ops@example.com", Why: "the provider's dashboard", Retention: time.Hour}))
}

// An UNKNOWN record resolved not applied (the charge did not happen) is no
// longer past a started step: the completer leaves it to its client, as
// it leaves one that never reached a step, and charges nobody. Regression:
// the cleared step's row counted as started, and the completer charged
// the customer anew without the client.
func TestCompleterLeavesAResolutionNotApplied(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), true, nil)
		s.failWrites.Store(true)
		require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
		c := s.completer(t, completer.Config{MaxAttempts: 2, Grace: 1})
		for range 3 {
			cycle(t, c)
		}
		rec := record(t, s.store, "pay-1")
		require.Equal(t, idemdriver.StateUnknown, rec.State)
		runs := s.runs.Load()

		resolve(t, s.store, "pay-1", false, "")
		s.failWrites.Store(false)
		for range 3 {
			cycle(t, c)
		}
		require.Equal(t, runs, s.runs.Load(), "not re-driven")
		rec = record(t, s.store, "pay-1")
		require.Equal(t, idemdriver.StateFailed, rec.State, "left to its client")
		require.Equal(t, http.StatusCreated, s.send("acme", "pay-1").Code, "the client's retry runs it")
	})
}

// A FAILED execution that never reached a step is not re-driven.
func TestCompleterLeavesExecutionsWithoutSteps(t *testing.T) {
	t.Parallel()
	s := newShop(t, adaptertest.SQLite(t), true, nil)
	failing := s.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.runs.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set(idem.HeaderKey, "k")
	req = req.WithContext(context.WithValue(req.Context(), merchantKey{}, "acme"))
	failing.ServeHTTP(httptest.NewRecorder(), req)
	c := s.completer(t, completer.Config{Grace: 1})
	cycle(t, c)
	require.Equal(t, int32(1), s.runs.Load())
	require.Zero(t, c.Stats().Redriven)
}

// Two completers on one store: one leads, the other stands by.
func TestCompleterElection(t *testing.T) {
	t.Parallel()
	s := newShop(t, adaptertest.SQLite(t), true, nil)
	a := s.completer(t, completer.Config{Holder: "a"})
	b := s.completer(t, completer.Config{Holder: "b"})
	cycle(t, a)
	cycle(t, b)
	require.True(t, a.Stats().Leader)
	require.False(t, b.Stats().Leader)
}

// An execution whose owner died before any step (PROCESSING past its
// lease) is ended FAILED, never run by the completer; a damaged one is
// left to an operator. The client's retry then runs it.
func TestCompleterEndsStuckWithoutSteps(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), true, nil)
		ctx := context.Background()
		res, err := s.store.Claim(ctx, idemdriver.ClaimParams{Scope: "acme", Key: "dead", Method: "POST", Path: "/v1/payments",
			Fingerprint: make([]byte, 32), LeaseDuration: time.Second, Retention: time.Hour})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		c := s.completer(t, completer.Config{Grace: time.Minute, ClockOffset: time.Hour})
		cycle(t, c)
		rec := record(t, s.store, "dead")
		require.Equal(t, idemdriver.StateFailed, rec.State)
		require.EqualValues(t, 1, c.Stats().Ended)
		require.Zero(t, c.Stats().Redriven)
		require.Zero(t, s.runs.Load())
	})
}

// An execution whose route keeps no request (here: KeepForRedrive off; Do
// and gRPC alike) is left to its client: not re-driven, not ended, and the
// client's retry resumes it. Regression: it was ended UNKNOWN
// (not-redrivable), which turned a retry that would have succeeded into a
// 409 outcome-unknown.
func TestCompleterLeavesWhatItCannotRedrive(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), false, nil)
		s.failWrites.Store(true)
		require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
		var reported atomic.Int32
		c := s.completer(t, completer.Config{MaxAttempts: 2, Grace: 1, OnRedrive: func(completer.Outcome) { reported.Add(1) }})
		for range 3 {
			cycle(t, c)
		}
		rec := record(t, s.store, "pay-1")
		require.Equal(t, idemdriver.StateFailed, rec.State)
		require.Zero(t, c.Stats().Redriven)
		require.EqualValues(t, 3, c.Stats().Skipped, "once per cycle that reads it")
		// Regression (a fresh user's hook): OnRedrive was called each cycle
		// for a record left alone, an Outcome with no status and no give-up.
		require.Zero(t, reported.Load(), "nothing re-driven, nothing given up: not reported")
		s.failWrites.Store(false)
		require.Equal(t, http.StatusCreated, s.send("acme", "pay-1").Code, "the client's retry resumes it")
		require.Equal(t, int32(1), s.calls.Load())
	})
}

// A kept request that no longer matches its record's fingerprint (here:
// its body edited in the table) is refused by the middleware's claim
// (422), never run, and the completer ends the execution UNKNOWN
// (not-redrivable) instead of sending it again every cycle. Regression: it
// was re-sent, and refused, at every cycle, forever.
func TestCompleterGivesUpOnAMismatchedKeptRequest(t *testing.T) {
	t.Parallel()
	store := adaptertest.SQLite(t)
	s := newShop(t, store, true, nil)
	s.failWrites.Store(true)
	require.Equal(t, http.StatusInternalServerError, s.send("acme", "pay-1").Code)
	s.failWrites.Store(false)

	ctx := context.Background()
	rec := record(t, store, "pay-1")
	steps, err := store.(idemdriver.Stepper).Steps(ctx, idemdriver.StepParams{Scope: "acme", Key: "pay-1", CreatedAt: rec.CreatedAt})
	require.NoError(t, err)
	var kept idemdriver.Step
	for _, st := range steps {
		if st.Name == idemdriver.KeptRequestStep {
			kept = st
		}
	}
	req, err := seal.DecodeRequest(kept.Relay)
	require.NoError(t, err)
	req.Body, req.Size = []byte(`{"amount":900}`), 14
	db := store.(interface{ DB() *sql.DB }).DB()
	_, err = db.ExecContext(ctx, `UPDATE idem_steps SET relay = ? WHERE name = ?`, seal.EncodeRequest(req), idemdriver.KeptRequestStep)
	require.NoError(t, err)

	c := s.completer(t, completer.Config{Grace: 1})
	cycle(t, c)
	cycle(t, c)
	rec = record(t, store, "pay-1")
	require.Equal(t, idemdriver.StateUnknown, rec.State)
	require.EqualValues(t, 1, c.Stats().GaveUp)
	require.Zero(t, c.Stats().Redriven)
	require.Equal(t, int32(1), s.runs.Load(), "the edited request never ran")
}

// An at-most-once step started without a result, on a route that keeps no
// request (Do, gRPC): left to its client's retry or its queue's
// redelivery, until its record nears its expiry; then held UNKNOWN
// (step-unrecorded), because a request after the expiry would start a new
// life and run the step again. Regression: found by a fresh user, the
// record expired, and the next Do ran the step a second time.
func TestCompleterHoldsAnExpiringAtMostOnceStart(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) idem.Store) {
		s := newShop(t, store(t), false, nil)
		ctx := context.Background()
		res, err := s.store.Claim(ctx, idemdriver.ClaimParams{Scope: "acme", Key: "sms-1", Method: "DO",
			Fingerprint: make([]byte, 32), LeaseDuration: time.Second, Retention: time.Hour})
		require.NoError(t, err)
		rec := res.Record
		_, err = s.store.(idemdriver.Stepper).StartStep(ctx, idemdriver.StartStepParams{StepParams: idemdriver.StepParams{
			Scope: "acme", Key: "sms-1", FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt, Name: "sms"},
			Relay: []byte("relay"), AtMostOnce: true})
		require.NoError(t, err)

		early := s.completer(t, completer.Config{Grace: 1, ClockOffset: time.Minute})
		cycle(t, early)
		got := record(t, s.store, "sms-1")
		require.Equal(t, idemdriver.StateProcessing, got.State, "well before its expiry: left to its client")
		require.EqualValues(t, 1, early.Stats().Skipped)

		late := s.completer(t, completer.Config{Grace: 1, ClockOffset: time.Hour - 5*time.Minute, Holder: "late"})
		cycle(t, late)
		got = record(t, s.store, "sms-1")
		require.Equal(t, idemdriver.StateUnknown, got.State, "near its expiry: held for an operator")
		require.True(t, got.CreatedAt.Equal(rec.CreatedAt), "the same life")
		steps, err := s.store.(idemdriver.Stepper).Steps(ctx, idemdriver.StepParams{Scope: "acme", Key: "sms-1", CreatedAt: rec.CreatedAt})
		require.NoError(t, err)
		require.Equal(t, idemdriver.ReasonStepUnrecorded, steps[0].Reason)
	})
}

// record is key's record in scope "acme" of store.
func record(t *testing.T, store idemdriver.Driver, key string) idemdriver.Record {
	t.Helper()
	rec, err := store.Get(context.Background(), idemdriver.GetParams{Scope: "acme", Key: key})
	require.NoError(t, err)
	return rec
}
