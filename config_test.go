package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	t.Parallel()
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
	t.Parallel()
	c := idem.Options{}.WithDefaults()
	require.Equal(t, 30*time.Second, c.Engine.Lease.Duration)
	require.Equal(t, 24*time.Hour, c.Engine.Retention)
	require.Equal(t, 10*time.Second, c.Engine.Timeouts.Claim)
	require.Equal(t, 10*time.Minute, c.Engine.Lease.MaxExecution)
	require.Equal(t, time.Second, c.Engine.RetryAfter.InFlight)
	require.EqualValues(t, 1<<20, c.Request.MaxBytes)
	require.EqualValues(t, 1<<20, c.Engine.Response.MaxBytes)
	require.EqualValues(t, 4<<20, c.Request.Drain.Bytes)
	require.Equal(t, 10*time.Second, c.Request.Drain.Timeout)
	require.Equal(t, []string{http.MethodPost, http.MethodPatch}, c.Methods)
	require.Equal(t, idem.DefaultReplayHeaders(), c.Replay.Headers)
	require.Nil(t, c.Scope, "the scope has no default: New refuses a nil Scope")
	scope, err := idem.SingleTenant(&http.Request{Header: http.Header{"X-Tenant": {"attacker"}}})
	require.NoError(t, err)
	require.Equal(t, idem.SingleTenantScope, scope, "the single-tenant scope never reads a client header")

	// A short Retention bounds the default MaxExecution, so that every
	// recorded outcome is replayed (CONTRACT section 9).
	short := idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}, Retention: 2 * time.Second}}.WithDefaults()
	require.Equal(t, time.Second, short.Engine.Lease.MaxExecution)
}

// Regression: DefaultMethods and DefaultReplayHeaders were package
// variables that every Config shared: one Config's edit changed all others.
func TestDefaultListsAreCopies(t *testing.T) {
	t.Parallel()
	a, b := idem.Options{}.WithDefaults(), idem.Options{}.WithDefaults()
	a.Methods[0], a.Replay.Headers[0] = "DELETE", "X-Mine"
	require.Equal(t, http.MethodPost, b.Methods[0])
	require.Equal(t, "Content-Type", b.Replay.Headers[0])
	require.Equal(t, http.MethodPost, idem.DefaultMethods()[0])
	require.Equal(t, "Content-Type", idem.DefaultReplayHeaders()[0])
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := idem.NewMiddleware(nil, idem.Options{Scope: idem.SingleTenant})
	require.ErrorContains(t, err, "Store is required")

	d := openSQLite(t)
	// Regression: a nil Scope put every request in one "global" scope, so a
	// multi-tenant API that forgot it replayed one tenant's response to
	// another.
	_, err = idem.NewMiddleware(d, idem.Options{})
	require.ErrorContains(t, err, "Scope is required")

	for name, tc := range map[string]struct {
		cfg  idem.Options
		want string
	}{
		"lease below 1s":         {idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: 500 * time.Millisecond}}}, "Engine.Lease.Duration 500ms is below 1s"},
		"retention below lease":  {idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Minute}, Retention: time.Second}}, "Engine.Retention 1s is shorter than Engine.Lease.Duration 1m0s"},
		"negative request limit": {idem.Options{Request: idem.RequestOptions{MaxBytes: -1}}, "Request.MaxBytes must not be negative"},
		"negative store retry":   {idem.Options{Engine: idem.EngineOptions{RetryAfter: idem.RetryAfterOptions{Store: -time.Second}}}, "Engine.RetryAfter.Store must not be negative"},
		"negative discard":       {idem.Options{Request: idem.RequestOptions{Drain: idem.DrainOptions{Bytes: -1}}}, "Request.Drain.Bytes must not be negative"},
		"negative discard time":  {idem.Options{Request: idem.RequestOptions{Drain: idem.DrainOptions{Timeout: -time.Second}}}, "Request.Drain.Timeout must not be negative"},
		"negative in-flight":     {idem.Options{Engine: idem.EngineOptions{RetryAfter: idem.RetryAfterOptions{InFlight: -time.Second}}}, "Engine.RetryAfter.InFlight must not be negative"},
		"execution below lease":  {idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{MaxExecution: time.Second}}}, "Engine.Lease.MaxExecution 1s is shorter than Engine.Lease.Duration"},
		// Regression (lease 1 s, Retention 2 s, a 3 s handler): New accepted
		// a Retention shorter than an execution may last, and the retry
		// after the completion found the record expired and ran again.
		"retention below execution": {idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second, MaxExecution: 10 * time.Minute}, Retention: 2 * time.Second}},
			"shorter than Engine.Lease.MaxExecution"},
		// Regression (a new user's try): fields the engine cannot honour
		// were accepted and silently ignored.
		"one-commit wait in durable-claim mode": {idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Wait: time.Second}}}, "Engine.OneCommit.Wait applies to the one-commit mode"},
		"a method with a space":                 {idem.Options{Methods: []string{"PO ST"}}, `"PO ST" is not a method`},
		"an empty method":                       {idem.Options{Methods: []string{"POST", ""}}, `"" is not a method`},
		// Regression (a fresh user's try): MariaDB refused a 256-byte method as
		// a scope it cannot store; SQLite and PostgreSQL took it.
		"a method too long": {idem.Options{Methods: []string{strings.Repeat("P", 256)}}, "at most MaxMethodLength (255)"},
		// Regression (a new user's try): settings that do nothing were accepted.
		"a cache's TTL, no cache": {idem.Options{Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{TTL: time.Minute}}}, "Replay.Cache.TTL applies with Replay.Cache.Bytes only"},
		// Regression (a fresh user's try): a name no header can have was
		// accepted, and never replayed.
		"a replayed header with a space": {idem.Options{Replay: idem.ReplayOptions{Headers: []string{"Content-Type", "bad header"}}}, `Replay.Headers: "bad header" is not a header name`},
	} {
		tc.cfg.Scope = idem.SingleTenant
		_, err := idem.NewMiddleware(d, tc.cfg)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, err = idem.NewMiddleware(d, idem.Options{Scope: idem.SingleTenant})
	require.NoError(t, err)
	_, err = idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}, Retention: 2 * time.Second}, Scope: idem.SingleTenant})
	require.NoError(t, err, "the default MaxExecution fits a short Retention")
}

// A Replay.Headers list that names a header idem never replays is taken,
// and said once: the name does nothing, and the reader is told why.
func TestNeverReplayedHeaderIsLogged(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer // NewMiddleware logs before it returns
	logger := slog.New(slog.NewTextHandler(&log, nil))
	_, err := idem.NewMiddleware(openSQLite(t), idem.Options{Scope: idem.SingleTenant, Engine: idem.EngineOptions{Logger: logger},
		Replay: idem.ReplayOptions{Headers: append(idem.DefaultReplayHeaders(), "set-cookie")}})
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(log.String(), "never replayed"), log.String())
	require.Contains(t, log.String(), "header=Set-Cookie")

	log.Reset()
	_, err = idem.NewMiddleware(openSQLite(t), idem.Options{Scope: idem.SingleTenant, Engine: idem.EngineOptions{Logger: logger}})
	require.NoError(t, err)
	require.Empty(t, log.String(), "the default list names none")
}

func TestProblemFor(t *testing.T) {
	t.Parallel()
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

// Regression: ProblemFor promised errors.Is matching but looked the error
// up in a map, so a wrapped sentinel became a 500.
func TestProblemForWrappedSentinel(t *testing.T) {
	t.Parallel()
	p := idem.ProblemFor(fmt.Errorf("while answering: %w", idem.ErrInFlight), "busy")
	require.Equal(t, 409, p.Status)
	require.Equal(t, idem.ProblemTypeBase+"request-in-flight", p.Type)
	store := idem.ProblemFor(&idem.StoreError{Op: "claim", Err: context.DeadlineExceeded}, "x")
	require.Equal(t, 503, store.Status)
	require.Equal(t, idem.ProblemTypeBase+"store-unavailable", store.Type)
	require.Equal(t, 500, idem.ProblemFor(fmt.Errorf("other"), "x").Status)
}

// requireKind checks that rec is a problem details answer of the kind slug.
func requireKind(t *testing.T, rec *httptest.ResponseRecorder, status int, slug string) {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Contains(t, rec.Body.String(), `"type":"`+idem.ProblemTypeBase+slug+`"`)
}

// Regression: a scope longer than the drivers' column was answered 503
// store-unavailable (an invitation to retry what can never succeed). And
// (CONTRACT section 8) a scope no store can hold (not UTF-8, a NUL byte) is
// a server fault answered 500 once, not a 503 from the store.
func TestScopeUnstorable(t *testing.T) {
	t.Parallel()
	for name, scope := range map[string]string{
		"too long":    strings.Repeat("s", idem.MaxScopeLength+1),
		"invalid utf": "acct\xff",
		"nul":         "acct\x00",
	} {
		c := &counter{}
		h := newMiddleware(t, nil, idem.Options{Scope: func(*http.Request) (string, error) { return scope, nil }}).Handler(c)
		requireKind(t, send(h, "POST", "/x", "k", "{}"), http.StatusInternalServerError, "scope-unstorable")
		require.Zero(t, c.runs, name)
	}
}

// A path longer than MaxPathLength is the client's mistake: 414, before any
// claim. Regression: on MySQL the driver refused it as a store error, a 503
// that idemclient retried eight times.
func TestPathTooLong(t *testing.T) {
	t.Parallel()
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, nil, idem.Options{}).Handler(c)
	at := func(path string) *httptest.ResponseRecorder {
		return send(h, "POST", path, "k-"+strconv.Itoa(len(path)), "{}")
	}
	requireKind(t, at("/"+strings.Repeat("p", idem.MaxPathLength)), http.StatusRequestURITooLong, "path-too-long")
	require.Zero(t, c.runs)
	require.Equal(t, http.StatusCreated, at("/"+strings.Repeat("p", idem.MaxPathLength-1)).Code)
}

// failingBody fails after its first bytes, as a client that stops sending.
type failingBody struct{ sent bool }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.sent {
		return 0, fmt.Errorf("connection reset by peer")
	}
	b.sent = true
	return copy(p, `{"amount":`), nil
}

func (b *failingBody) Close() error { return nil }

// A body that cannot be read to its end is answered 400 body-unreadable,
// through the kind table, without claiming the key.
func TestBodyUnreadable(t *testing.T) {
	t.Parallel()
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, nil, idem.Options{}).Handler(c)
	rec := send(h, "POST", "/x", "k", "", func(r *http.Request) { r.Body = &failingBody{} })
	requireKind(t, rec, http.StatusBadRequest, "body-unreadable")
	require.NotContains(t, rec.Body.String(), "connection reset", "the detail does not leak the transport's error")
	require.Zero(t, c.runs)
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code, "nothing was claimed")
}

// An empty scope is no scope: 401 missing-scope, the handler not run.
// Regression: a Scope function that read "" for an unauthenticated request
// put every such request in one shared scope, where strangers' keys met.
func TestEmptyScopeIsMissing(t *testing.T) {
	t.Parallel()
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, nil, idem.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }}).Handler(c)
	as := func(account string) *httptest.ResponseRecorder {
		return send(h, "POST", "/x", "k", "{}", func(r *http.Request) {
			if account != "" {
				r.Header.Set("X-Account", account)
			}
		})
	}
	rec := as("")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), idem.ProblemTypeBase+"missing-scope")
	require.Zero(t, c.runs)
	require.Equal(t, http.StatusCreated, as("acct_1").Code)
	require.Equal(t, 1, c.runs)
}

// Regression: a heartbeat that could not reach the store for a whole lease
// answered 409 "another request took its key over" although nobody had.
func TestStoreLostDuringHandler(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}}})
	started := make(chan struct{})
	var cause error
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // cancelled once the lease could not be renewed
		cause = context.Cause(r.Context())
	}))
	var rec *httptest.ResponseRecorder
	done := make(chan struct{})
	go func() { defer close(done); rec = send(h, "POST", "/x", "k", "{}") }()
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
	t.Parallel()
	path := dbtest.SQLitePath(t)
	d, err := idemsqlite.Open(t.Context(), path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	require.NoError(t, d.Migrate(t.Context()))
	// Another process holds SQLite's write lock.
	other, err := idemsqlite.Open(t.Context(), path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.Close()) })
	tx, err := other.DB().BeginTx(t.Context(), nil) // BEGIN IMMEDIATE
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })

	c := &counter{}
	h := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Timeouts: idem.TimeoutOptions{Claim: 200 * time.Millisecond}}}).Handler(c)
	rec := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Zero(t, c.runs)
}

// The Scope function's error belongs to the server (a session store's
// failure, say): the 401 says what the client must do, never the error's
// text. Regression: the detail was err.Error(), which reached the client.
func TestScopeErrorIsNotSentToTheClient(t *testing.T) {
	t.Parallel()
	secret := "dial tcp 10.0.0.7:6379: session store password=hunter2"
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, nil, idem.Options{Scope: func(*http.Request) (string, error) { return "", errors.New(secret) }}).Handler(c)
	rec := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), idem.ProblemTypeBase+"missing-scope")
	require.NotContains(t, rec.Body.String(), "hunter2")
	require.NotContains(t, rec.Body.String(), "10.0.0.7")
	require.Zero(t, c.runs)
}
