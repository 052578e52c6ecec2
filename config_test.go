package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

func TestDefaultOutcome(t *testing.T) {
	for status, want := range map[int]idem.Outcome{
		200: idem.Succeeded, 201: idem.Succeeded, 204: idem.Succeeded, 302: idem.Succeeded,
		400: idem.Succeeded, 402: idem.Succeeded, 404: idem.Succeeded, 409: idem.Succeeded, 422: idem.Succeeded,
		408: idem.Failed, 425: idem.Failed, 429: idem.Failed,
		500: idem.Failed, 502: idem.Failed, 503: idem.Failed, 504: idem.Failed,
	} {
		require.Equal(t, want, idem.DefaultOutcome(status), "status %d", status)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := idem.Config{}.WithDefaults()
	require.Equal(t, 30*time.Second, c.LeaseDuration)
	require.Equal(t, 24*time.Hour, c.Retention)
	require.Equal(t, 10*time.Second, c.ClaimTimeout)
	require.Equal(t, 10*time.Minute, c.MaxExecution)
	require.EqualValues(t, 1<<20, c.MaxRequestBytes)
	require.EqualValues(t, 1<<20, c.MaxResponseBytes)
	require.Equal(t, []string{http.MethodPost, http.MethodPatch}, c.Methods)
	require.Equal(t, idem.DefaultReplayHeaders, c.ReplayHeaders)
	scope, err := c.Scope(&http.Request{Header: http.Header{"X-Tenant": {"attacker"}}})
	require.NoError(t, err)
	require.Equal(t, "global", scope, "the default scope never reads a client header")
}

func TestNewValidates(t *testing.T) {
	_, err := idem.New(idem.Config{})
	require.ErrorContains(t, err, "Store is required")

	d, err := idemsqlite.Open(t.Context(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	for name, cfg := range map[string]idem.Config{
		"lease below 1s":         {Store: d, LeaseDuration: 500 * time.Millisecond},
		"retention below lease":  {Store: d, LeaseDuration: time.Minute, Retention: time.Second},
		"negative request limit": {Store: d, MaxRequestBytes: -1},
		"negative store retry":   {Store: d, StoreRetryAfter: -time.Second},
		"execution below lease":  {Store: d, MaxExecution: time.Second},
	} {
		_, err := idem.New(cfg)
		require.Error(t, err, name)
	}
	_, err = idem.New(idem.Config{Store: d})
	require.NoError(t, err)
}

func TestProblemFor(t *testing.T) {
	p := idem.ProblemFor(idem.ErrInFlight, "busy")
	require.Equal(t, idem.ProblemTypeBase+"request-in-flight", p.Type)
	require.Equal(t, 409, p.Status)
	require.Equal(t, "about:blank", idem.ProblemFor(nil, "x").Type)
	require.Equal(t, 500, idem.ProblemFor(nil, "x").Status)

	// The body is JSON for API clients, not HTML: <, > and & stay as written.
	rec := httptest.NewRecorder()
	idem.ProblemFor(idem.ErrMissingKey, "send Idempotency-Key: <a UUID> & retry").Write(rec)
	require.Contains(t, rec.Body.String(), `"detail":"send Idempotency-Key: <a UUID> & retry"`)
	require.True(t, strings.HasSuffix(rec.Body.String(), "}\n"), "one newline at the end")
}

// Regression: a scope longer than the drivers' column was answered 503
// store-unavailable (an invitation to retry what can never succeed).
func TestScopeTooLong(t *testing.T) {
	d, err := idemsqlite.Open(t.Context(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	mw, err := idem.New(idem.Config{Store: d, Logger: slog.New(slog.DiscardHandler),
		Scope: func(*http.Request) (string, error) { return strings.Repeat("s", idem.MaxScopeLength+1), nil }})
	require.NoError(t, err)
	ran := false
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
	req.Header.Set(idem.HeaderKey, "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.False(t, ran)
}

// A path longer than MaxPathLength is the client's mistake: 414, before any
// claim. Regression: on MySQL the driver refused it as a store error, a 503
// that idemclient retried eight times.
func TestPathTooLong(t *testing.T) {
	d, err := idemsqlite.Open(t.Context(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	mw, err := idem.New(idem.Config{Store: d})
	require.NoError(t, err)
	runs := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { runs++; w.WriteHeader(201) }))
	send := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", path, strings.NewReader("{}"))
		req.Header.Set(idem.HeaderKey, "k-"+strconv.Itoa(len(path)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	long := send("/" + strings.Repeat("p", idem.MaxPathLength))
	require.Equal(t, http.StatusRequestURITooLong, long.Code)
	require.Equal(t, "application/problem+json", long.Header().Get("Content-Type"))
	require.Zero(t, runs)
	require.Equal(t, http.StatusCreated, send("/"+strings.Repeat("p", idem.MaxPathLength-1)).Code)
}

// An empty scope is no scope: 401 missing-scope, the handler not run.
// Regression: a Scope function that read "" for an unauthenticated request
// put every such request in one shared scope, where strangers' keys met.
func TestEmptyScopeIsMissing(t *testing.T) {
	d, err := idemsqlite.Open(t.Context(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	mw, err := idem.New(idem.Config{Store: d,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }})
	require.NoError(t, err)
	runs := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { runs++; w.WriteHeader(201) }))
	send := func(account string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
		req.Header.Set(idem.HeaderKey, "k")
		if account != "" {
			req.Header.Set("X-Account", account)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := send("")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), idem.ProblemTypeBase+"missing-scope")
	require.Zero(t, runs)
	require.Equal(t, http.StatusCreated, send("acct_1").Code)
	require.Equal(t, 1, runs)
}

// Regression: a heartbeat that could not reach the store for a whole lease
// answered 409 "another request took its key over" although nobody had.
func TestStoreLostDuringHandler(t *testing.T) {
	d, err := idemsqlite.Open(t.Context(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	require.NoError(t, d.Migrate(t.Context()))
	mw, err := idem.New(idem.Config{Store: d, LeaseDuration: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	started := make(chan struct{})
	var cause error
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // cancelled once the lease could not be renewed
		cause = context.Cause(r.Context())
	}))
	req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
	req.Header.Set(idem.HeaderKey, "k")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); h.ServeHTTP(rec, req) }()
	<-started
	require.NoError(t, d.Close()) // the store goes away mid-handler
	<-done
	require.ErrorIs(t, cause, idem.ErrStoreUnavailable)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "store-unavailable")
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
}

// Regression: a claim that waited on a lock held elsewhere hung the request
// for as long as the lock was held.
func TestClaimTimeout(t *testing.T) {
	path := dbtest.SQLitePath(t)
	d, err := idemsqlite.Open(t.Context(), path)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	// Another process holds SQLite's write lock.
	other, err := idemsqlite.Open(t.Context(), path)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	tx, err := other.DB().BeginTx(t.Context(), nil) // BEGIN IMMEDIATE
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })

	mw, err := idem.New(idem.Config{Store: d, ClaimTimeout: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ran := false
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	req := httptest.NewRequest("POST", "/x", strings.NewReader("{}"))
	req.Header.Set(idem.HeaderKey, "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.False(t, ran)
}
