package idem_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// Every answer to a protected request echoes its Idempotency-Key as sent
// (first execution, replay, 409, 422) and advertises the key's expiry as
// an HTTP-date: the record's expires_at, rounded down to the second.
func TestKeyEchoAndExpiry(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	started, release := make(chan struct{}), make(chan struct{})
	h := newMiddleware(t, d, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
	}))
	first := send(h, "POST", "/x", `"k-1"`, "{}")
	require.Equal(t, http.StatusCreated, first.Code)
	wantExpires := record(t, d, idem.SingleTenantScope, "k-1").ExpiresAt.UTC().Truncate(time.Second)

	check := func(name string, got interface{ Header() http.Header }, status, wantStatus int) {
		t.Helper()
		require.Equal(t, wantStatus, status, name)
		require.Equal(t, `"k-1"`, got.Header().Get(idem.HeaderKey), "%s echoes the key as sent", name)
		exp, err := http.ParseTime(got.Header().Get(idem.HeaderKeyExpires))
		require.NoError(t, err, "%s: an HTTP-date", name)
		require.True(t, exp.Equal(wantExpires), "%s: %s, want %s", name, exp, wantExpires)
	}
	check("first", first, first.Code, http.StatusCreated)
	replay := send(h, "POST", "/x", `"k-1"`, "{}")
	check("replay", replay, replay.Code, http.StatusCreated)
	require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
	reused := send(h, "POST", "/x", `"k-1"`, `{"a":1}`)
	check("key reused", reused, reused.Code, http.StatusUnprocessableEntity)

	done := make(chan struct{})
	go func() { defer close(done); send(h, "POST", "/slow", "k-2", "{}") }()
	<-started
	inFlight := send(h, "POST", "/slow", "k-2", "{}")
	require.Equal(t, http.StatusConflict, inFlight.Code)
	require.Equal(t, "k-2", inFlight.Header().Get(idem.HeaderKey))
	_, err := http.ParseTime(inFlight.Header().Get(idem.HeaderKeyExpires))
	require.NoError(t, err)
	close(release)
	<-done

	// Not stored for replay even when allow-listed: the replay's own are sent.
	h2 := newMiddleware(t, nil, idem.Options{Replay: idem.ReplayOptions{Headers: []string{idem.HeaderKey, idem.HeaderKeyExpires}}}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(idem.HeaderKeyExpires, "stale")
			w.WriteHeader(http.StatusCreated)
		}))
	send(h2, "POST", "/x", "k", "{}")
	require.NotEqual(t, "stale", send(h2, "POST", "/x", "k", "{}").Header().Get(idem.HeaderKeyExpires))
}

// A released execution leaves no record: no expiry is advertised.
func TestReleasedAdvertisesNoExpiry(t *testing.T) {
	t.Parallel()
	h := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{Outcome: idem.ReleaseValidationFailures}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
	}))
	got := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusBadRequest, got.Code)
	require.Equal(t, "k", got.Header().Get(idem.HeaderKey))
	require.Empty(t, got.Header().Get(idem.HeaderKeyExpires))
}

// A ProblemWriter that writes only its body still answers a 409 with
// Retry-After and Cache-Control: no-store, which idem sets before calling it
// (a fresh user's writer lost both, and every client its retry delay).
func TestProblemWriterKeepsRetryAfter(t *testing.T) {
	t.Parallel()
	plain := func(w http.ResponseWriter, r *http.Request, p idem.Problem) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(p.Status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": p.Title})
	}
	h, release := heldOwner(newMiddleware(t, nil, idem.Options{ProblemWriter: plain}), "k")
	got := send(h, "POST", "/x", "k", "{}")
	release()
	require.Equal(t, http.StatusConflict, got.Code)
	require.Equal(t, "1", got.Header().Get("Retry-After"))
	require.Equal(t, "no-store", got.Header().Get("Cache-Control"))
	require.Equal(t, "application/json", got.Header().Get("Content-Type"))
}

// Config.ProblemWriter shapes idem's own error answers (here Stripe's
// error object, in-flight as 429 lock_timeout); the handler's answers do
// not go through it; Event.Status is the status it sent. Without it the
// answers stay RFC 9457 application/problem+json.
func TestProblemWriter(t *testing.T) {
	t.Parallel()
	stripe := func(w http.ResponseWriter, r *http.Request, p idem.Problem) {
		status, code := p.Status, "idempotency_error"
		if p.Type == idem.ProblemTypeBase+"request-in-flight" {
			status, code = http.StatusTooManyRequests, "lock_timeout"
		}
		w.Header().Set("Content-Type", "application/json")
		if p.RetryAfter > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int(p.RetryAfter.Seconds())))
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": code, "message": p.Detail}})
	}
	obs := &events{}
	started, release := make(chan struct{}), make(chan struct{})
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Observer: obs}, ProblemWriter: stripe})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusConflict) // the handler's own 409: not shaped
	}))
	done := make(chan struct{})
	go func() { defer close(done); send(h, "POST", "/x", "k", "{}") }()
	<-started
	got := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusTooManyRequests, got.Code)
	require.Equal(t, "application/json", got.Header().Get("Content-Type"))
	require.Contains(t, got.Body.String(), `"lock_timeout"`)
	require.Equal(t, "1", got.Header().Get("Retry-After"))
	close(release)
	<-done
	evs := obs.take()
	require.Len(t, evs, 2)
	require.Equal(t, idem.EventInFlight, evs[0].Kind)
	require.Equal(t, http.StatusTooManyRequests, evs[0].Status, "the status the ProblemWriter sent")
	replay := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusConflict, replay.Code, "the handler's answer is replayed as it was")
	require.Empty(t, replay.Body.String())

	missing := send(h, "POST", "/x", "", "{}")
	require.Equal(t, http.StatusBadRequest, missing.Code)
	require.Contains(t, missing.Body.String(), `"idempotency_error"`)

	def := send(newMiddleware(t, nil, idem.Options{}).Handler(http.NotFoundHandler()), "POST", "/x", "", "{}")
	require.Equal(t, "application/problem+json", def.Header().Get("Content-Type"), "the default stays RFC 9457")
}
