package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
)

// events records what an Observer was told.
type events struct {
	mu   sync.Mutex
	list []idem.Event
	ctxs []context.Context
}

func (o *events) Observe(ctx context.Context, e idem.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.list = append(o.list, e)
	o.ctxs = append(o.ctxs, ctx)
}

func (o *events) take() []idem.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.list
	o.list = nil
	return l
}

// takeOne takes the one event o was told since the last take, failing t
// when there is not exactly one or when it is not of kind.
func (o *events) takeOne(t testing.TB, kind idem.EventKind) idem.Event {
	t.Helper()
	evs := o.take()
	require.Len(t, evs, 1, "exactly one event per decision")
	require.Equal(t, kind, evs[0].Kind, evs[0].Kind.String())
	return evs[0]
}

// requireFailed checks a failed execution's answer got and the one event
// obs was told of it: both with status, the event of kind and with an error
// that is cause.
func requireFailed(t *testing.T, got *httptest.ResponseRecorder, obs *events, kind idem.EventKind, status int, cause error) idem.Event {
	t.Helper()
	require.Equal(t, status, got.Code, got.Body.String())
	ev := obs.takeOne(t, kind)
	require.ErrorIs(t, ev.Err, cause)
	require.Equal(t, status, ev.Status)
	return ev
}

type ctxMark struct{}

// Every decision emits exactly its event, with the route (the ServeMux
// pattern), the method, the attempt, the status sent, the outcome and the
// durations.
func TestObserverEvents(t *testing.T) {
	t.Parallel()
	type env struct {
		d   *idemsqlite.Driver
		h   http.Handler
		obs *events
	}
	// claimDead leaves a PROCESSING record of POST /pay/1 {} whose lease
	// ran out an hour ago: its worker died.
	claimDead := func(t *testing.T, d *idemsqlite.Driver, key string) {
		req := httptest.NewRequest("POST", "/pay/1", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		_, err := d.Claim(t.Context(), idemdriver.ClaimParams{Scope: idem.SingleTenantScope, Key: key, Method: "POST", Path: "/pay/1",
			Fingerprint: fingerprint.Request(req, []byte("{}")), LeaseDuration: time.Second, Retention: 24 * time.Hour,
			ClockOffset: -time.Hour})
		require.NoError(t, err)
	}
	cases := []struct {
		name    string
		prepare func(t *testing.T, e env) // requests before the observed one
		body    string
		status  int // the handler's status for the observed request
		want    idem.EventKind
		sent    int
		outcome idem.Outcome
		attempt int
		ran     bool
		errIs   error
	}{
		{name: "executed", status: 201, want: idem.EventExecuted, sent: 201, attempt: 1, ran: true},
		{name: "executed failed", status: 502, want: idem.EventExecuted, sent: 502, outcome: idem.Failed, attempt: 1, ran: true},
		{name: "re-claim of FAILED is executed", status: 201, want: idem.EventExecuted, sent: 201, attempt: 2, ran: true,
			prepare: func(t *testing.T, e env) { send(e.h, "POST", "/pay/1", "k", "{}", withStatus(502)) }},
		{name: "replayed", status: 201, want: idem.EventReplayed, sent: 201, attempt: 1,
			prepare: func(t *testing.T, e env) { send(e.h, "POST", "/pay/1", "k", "{}") }},
		{name: "key reused", body: `{"a":1}`, status: 201, want: idem.EventKeyReused, sent: 422, attempt: 1,
			prepare: func(t *testing.T, e env) { send(e.h, "POST", "/pay/1", "k", "{}") }},
		{name: "released", status: 400, want: idem.EventReleased, sent: 400, outcome: idem.Released, attempt: 1, ran: true},
		{name: "taken over", status: 201, want: idem.EventTakenOver, sent: 201, attempt: 2, ran: true,
			prepare: func(t *testing.T, e env) { claimDead(t, e.d, "k") }},
		{name: "store unavailable", status: 201, want: idem.EventStoreUnavailable, sent: 503, errIs: idem.ErrStoreUnavailable,
			prepare: func(t *testing.T, e env) { require.NoError(t, e.d.Close()) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := openSQLite(t)
			obs := &events{}
			mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Observer: obs, Response: idem.ResponseOptions{Outcome: idem.ReleaseValidationFailures}}})
			ran := false
			mux := http.NewServeMux()
			mux.Handle("POST /pay/{id}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran = true
				w.WriteHeader(statusOf(r, tc.status))
			})))
			e := env{d: d, h: mux, obs: obs}
			if tc.prepare != nil {
				tc.prepare(t, e)
			}
			obs.take()
			ran = false
			body := tc.body
			if body == "" {
				body = "{}"
			}
			got := send(mux, "POST", "/pay/1", "k", body)
			require.Equal(t, tc.sent, got.Code, got.Body.String())
			require.Equal(t, tc.ran, ran)
			ev := obs.takeOne(t, tc.want)
			require.Equal(t, tc.sent, ev.Status)
			require.Equal(t, "/pay/{id}", ev.Route, "the ServeMux pattern's path template, never the raw path")
			require.Equal(t, "POST", ev.Method)
			require.Equal(t, tc.attempt, ev.Attempt)
			require.Equal(t, idem.SingleTenantScope, ev.Scope)
			require.Equal(t, "k", ev.Key)
			require.Positive(t, ev.Claim)
			if tc.ran {
				require.Equal(t, tc.outcome, ev.Outcome)
				require.Positive(t, ev.Handler)
				require.Positive(t, ev.Completion)
			} else {
				require.Zero(t, ev.Handler)
				require.Zero(t, ev.Completion)
			}
			if tc.errIs != nil {
				require.ErrorIs(t, ev.Err, tc.errIs)
			} else {
				require.NoError(t, ev.Err)
			}
		})
	}
}

// withStatus asks the test handler for status.
func withStatus(status int) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("X-Status", http.StatusText(status)) }
}

// statusOf is the status withStatus asked for, else def.
func statusOf(r *http.Request, def int) int {
	for _, s := range []int{502, 201, 400} {
		if r.Header.Get("X-Status") == http.StatusText(s) {
			return s
		}
	}
	return def
}

// A request that arrives while the same request runs is told 409; the
// owner's execution reports its own event when it ends.
func TestObserverInFlight(t *testing.T) {
	t.Parallel()
	obs := &events{}
	h, release := heldOwner(newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Observer: obs}}), "k")
	require.Equal(t, http.StatusConflict, send(h, "POST", "/x", "k", "{}").Code)
	ev := obs.takeOne(t, idem.EventInFlight)
	require.Equal(t, http.StatusConflict, ev.Status)
	require.Equal(t, 1, ev.Attempt)
	require.Equal(t, "", ev.Route, "no pattern and no Config.Route: no route, never the path")
	release()
	require.Equal(t, http.StatusCreated, obs.takeOne(t, idem.EventExecuted).Status)
}

// An execution whose key was taken over while it ran is fenced out: lease
// lost, nothing recorded.
func TestObserverLeaseLost(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	obs := &events{}
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Observer: obs}, Route: func(*http.Request) string { return "payments" }})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Another worker, an hour later by the database clock, takes the
		// key over.
		body := []byte("{}")
		res, err := d.Claim(context.Background(), idemdriver.ClaimParams{Scope: idem.SingleTenantScope, Key: "k", Method: "POST", Path: "/x",
			Fingerprint: fingerprint.Request(r, body), LeaseDuration: time.Minute, Retention: 24 * time.Hour, ClockOffset: time.Hour})
		if err != nil || !res.Claimed || !res.TookOver {
			panic("the takeover did not happen")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	ev := requireFailed(t, send(h, "POST", "/x", "k", "{}"), obs, idem.EventLeaseLost, http.StatusConflict, idem.ErrLeaseLost)
	require.Equal(t, "payments", ev.Route, "Config.Route names a route without a pattern")
}

// A completion that fails (the store went away as the handler returned) is
// reported as completion failed, with the store's error.
func TestObserverCompletionFailed(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	obs := &events{}
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Observer: obs}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = d.Close()
		w.WriteHeader(http.StatusCreated)
	}))
	requireFailed(t, send(h, "POST", "/x", "k", "{}"), obs, idem.EventCompletionFailed, http.StatusServiceUnavailable, idem.ErrStoreUnavailable)
}

// Requests refused before the claim and methods passed through emit
// nothing; a nil Observer is allowed.
func TestObserverSilentBeforeClaim(t *testing.T) {
	t.Parallel()
	obs := &events{}
	h := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Observer: obs}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	require.Equal(t, http.StatusBadRequest, send(h, "POST", "/x", "", "{}").Code)
	require.Equal(t, http.StatusOK, send(h, "GET", "/x", "k", "").Code)
	require.Empty(t, obs.take())
	h = newMiddleware(t, nil, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	require.Equal(t, http.StatusOK, send(h, "POST", "/x", "k", "{}").Code)
}

// idem wrapping a ServeMux (not a route) still names the route: the
// pattern the mux set on the request the handler got.
func TestObserverRouteFromInnerMux(t *testing.T) {
	t.Parallel()
	obs := &events{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	h := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Observer: obs}}).Handler(mux)
	require.Equal(t, http.StatusCreated, send(h, "POST", "/v1/payments/42", "k", "{}").Code)
	require.Equal(t, "/v1/payments/{id}", obs.takeOne(t, idem.EventExecuted).Route, "http.route: the path template, without the method")
	// Regression: a replay never reaches the mux, and was labelled "".
	require.Equal(t, http.StatusCreated, send(h, "POST", "/v1/payments/42", "k", "{}").Code)
	require.Equal(t, "/v1/payments/{id}", obs.takeOne(t, idem.EventReplayed).Route, "a replay's route, from the mux it wraps")
}

// ctxHandler is a slog.Handler that records whether each record was logged
// with the request's context.
type ctxHandler struct {
	mu      sync.Mutex
	records int
	without int
}

func (h *ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *ctxHandler) Handle(ctx context.Context, _ slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records++
	if ctx.Value(ctxMark{}) == nil {
		h.without++
	}
	return nil
}
func (h *ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *ctxHandler) WithGroup(string) slog.Handler      { return h }

// Every log call gets the request's context (Logger.*Context), so trace ids
// it carries reach idem's records.
func TestLogCallsCarryRequestContext(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	lh := &ctxHandler{}
	obs := &events{}
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Logger: slog.New(lh), Observer: obs}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = d.Close() // the completion fails and logs
		w.WriteHeader(http.StatusCreated)
	}))
	mark := withContext(context.WithValue(context.Background(), ctxMark{}, true))
	require.Equal(t, http.StatusServiceUnavailable, send(h, "POST", "/x", "k", "{}", mark).Code)
	require.Equal(t, http.StatusServiceUnavailable, send(h, "POST", "/x", "k2", "{}", mark).Code) // the claim fails and logs
	lh.mu.Lock()
	defer lh.mu.Unlock()
	require.GreaterOrEqual(t, lh.records, 2)
	require.Zero(t, lh.without, "every log call carries the request's context")
	for _, ctx := range obs.ctxs {
		require.NotNil(t, ctx.Value(ctxMark{}), "the observer gets the request's context")
	}
}
