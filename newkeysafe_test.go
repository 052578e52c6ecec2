package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// newKeySafe is the new_key_safe member of rec's problem body, failing t
// when the body is no problem or has none.
func newKeySafe(t *testing.T, rec *httptest.ResponseRecorder) bool {
	t.Helper()
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"), "status %d: %s", rec.Code, rec.Body)
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	safe, ok := body["new_key_safe"].(bool)
	require.True(t, ok, "no boolean new_key_safe in %s", rec.Body)
	return safe
}

// Every problem body of the middleware says whether a new key is safe:
// true only where this request could never be claimed under its key or the
// key is another method's or path's (CONTRACT section 11.5).
func TestProblemSaysWhetherANewKeyIsSafe(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	started, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	mw := newMiddleware(t, store, idem.Options{Request: idem.RequestOptions{MaxBytes: 16}})
	h := mw.Handler(slow)

	require.True(t, newKeySafe(t, send(h, http.MethodPost, "/pay", "", `{}`)), "missing-key")
	require.True(t, newKeySafe(t, send(h, http.MethodPost, "/pay", strings.Repeat("k", idem.MaxKeyLength+1), `{}`)), "invalid-key")
	// A key header repeated or a list, as from a client that adds it again
	// on each retry: its first attempt may have run under the first value.
	require.False(t, newKeySafe(t, send(h, http.MethodPost, "/pay", "k0, k0", `{}`)), "invalid-key: a list")
	require.False(t, newKeySafe(t, send(h, http.MethodPost, "/pay", "k0", `{}`, func(r *http.Request) { r.Header.Add(idem.HeaderKey, "k0") })),
		"invalid-key: the header twice")
	require.False(t, newKeySafe(t, send(h, http.MethodPost, "/pay", "k-big", strings.Repeat("x", 17))),
		"request-too-large: another process's body limit may have let an earlier attempt run")

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(h, http.MethodPost, "/pay", "k1", `{"a":1}`) }()
	<-started
	dup := send(h, http.MethodPost, "/pay", "k1", `{"a":1}`, func(r *http.Request) { r.Header.Set("Prefer", "wait=0") })
	require.Equal(t, http.StatusConflict, dup.Code)
	require.False(t, newKeySafe(t, dup), "request-in-flight: the first attempt may charge")
	close(release)
	require.Equal(t, http.StatusCreated, (<-first).Code)

	reused := send(h, http.MethodPost, "/pay", "k1", `{"a":2}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.Code)
	require.False(t, newKeySafe(t, reused), "key-reused, the same method and path: perhaps this request, its bytes changed")
	otherPath := send(h, http.MethodPost, "/refund", "k1", `{"a":1}`)
	require.Equal(t, http.StatusUnprocessableEntity, otherPath.Code)
	require.True(t, newKeySafe(t, otherPath), "key-reused, another path: the key's record is another request's")
	// The same route, escaped otherwise or its method in another case: a
	// router may take it as the same operation (a fresh user's ServeMux
	// did, and the new key its 422 called safe charged twice).
	escaped := send(h, http.MethodPost, "/%70ay", "k1", `{"a":1}`)
	require.Equal(t, http.StatusUnprocessableEntity, escaped.Code)
	require.False(t, newKeySafe(t, escaped), "key-reused, the same path escaped otherwise")
	lower := send(h, "post", "/pay", "k1", `{"a":1}`)
	require.Equal(t, http.StatusUnprocessableEntity, lower.Code)
	require.False(t, newKeySafe(t, lower), "key-reused, the same method in another case")

	noScope := newMiddleware(t, store, idem.Options{Scope: func(*http.Request) (string, error) { return "", nil }}).Handler(slow)
	require.False(t, newKeySafe(t, send(noScope, http.MethodPost, "/pay", "k1", `{"a":1}`)), "missing-scope: an earlier, authenticated attempt may have run")

	require.NoError(t, store.Close())
	down := send(h, http.MethodPost, "/pay", "k2", `{"a":1}`)
	require.Equal(t, http.StatusServiceUnavailable, down.Code)
	require.False(t, newKeySafe(t, down), "store-unavailable: an earlier attempt may have run")
}

// idem.NewKeySafe says of Do's errors what new_key_safe says of a problem:
// false for a recorded outcome (nil), an in-flight key, fn's own error and
// anything joined with an unsafe kind.
func TestNewKeySafeOfDoErrors(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	ok := func(context.Context) (idem.Result, error) { return idem.Result{Status: 201}, nil }

	_, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "bad,key"}, ok)
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	require.True(t, idem.NewKeySafe(err))

	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("a")}, ok)
	require.NoError(t, err)
	require.False(t, idem.NewKeySafe(err), "a recorded outcome: a new key runs fn again")

	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("b")}, ok)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.False(t, idem.NewKeySafe(err), "the same route, another payload: perhaps the same work, changed")
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Route: "refunds", Payload: []byte("a")}, ok)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.True(t, idem.NewKeySafe(err), "another route: the key is other work's")

	boom := errors.New("provider timeout")
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k2"}, func(context.Context) (idem.Result, error) { return idem.Result{}, boom })
	require.ErrorIs(t, err, boom)
	require.False(t, idem.NewKeySafe(err), "fn ran: its effect may have happened")

	require.False(t, idem.NewKeySafe(errors.Join(idem.ErrKeyReused, idem.ErrStoreUnavailable)), "one unsafe kind makes it unsafe")
	require.False(t, idem.NewKeySafe(&idem.InFlightError{RetryAfter: 1}))

	// fn's own error wrapping a sentinel that reads as safe (a nested Do's):
	// NewKeySafe of the error says true, the Report knows fn ran.
	nested := fmt.Errorf("downstream: %w", idem.ErrKeyReused)
	rep, err := g.DoReport(t.Context(), idem.DoParams{Scope: "s", Key: "k3"}, func(context.Context) (idem.Result, error) { return idem.Result{}, nested })
	require.ErrorIs(t, err, nested)
	require.True(t, idem.NewKeySafe(err))
	require.False(t, rep.NewKeySafe, "fn ran in this call")
	rep, err = g.DoReport(t.Context(), idem.DoParams{Scope: "s", Key: "k", Route: "refunds", Payload: []byte("a")}, ok)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.True(t, rep.NewKeySafe)
	rep, err = g.DoReport(t.Context(), idem.DoParams{Scope: "s", Key: "bad,key"}, ok)
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	require.True(t, rep.NewKeySafe)
}

// DoReport says whether its Result is the stored one, apart from fn's
// Result: false when fn ran, true on every replay (fn not run).
func TestDoReportSaysReplayed(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	runs := 0
	fn := func(context.Context) (idem.Result, error) {
		runs++
		return idem.Result{Status: 201, Body: []byte("charged")}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k", Payload: []byte("a")}
	rep, err := g.DoReport(t.Context(), p, fn)
	require.NoError(t, err)
	require.False(t, rep.Replayed)
	require.Equal(t, "charged", string(rep.Result.Body))
	for range 2 {
		rep, err = g.DoReport(t.Context(), p, fn)
		require.NoError(t, err)
		require.True(t, rep.Replayed)
		require.Equal(t, idem.Result{Status: 201, Header: map[string][]string{}, Body: []byte("charged")}, rep.Result)
	}
	require.Equal(t, 1, runs)

	failed := idem.DoParams{Scope: "s", Key: "k-failed"}
	rep, err = g.DoReport(t.Context(), failed, func(context.Context) (idem.Result, error) { return idem.Result{Status: 503}, nil })
	require.ErrorIs(t, err, idem.ErrOutcomeFailed)
	require.False(t, rep.Replayed, "fn's own 503, recorded FAILED")
	require.Equal(t, 503, rep.Result.Status)
}

// new_key_safe is a member of idem's own problem types; another type's
// problem (a handler's) carries it only when it says true.
func TestNewKeySafeOnlyOnIdemTypesOrTrue(t *testing.T) {
	t.Parallel()
	for p, want := range map[*idem.Problem]string{
		{Type: "https://example.com/probs/not-found", Title: "Not found", Status: 404}:                "",
		{Type: "https://example.com/probs/invalid", Title: "Invalid", Status: 400, NewKeySafe: true}:  `"new_key_safe":true`,
		{Type: idem.ProblemTypeBase + "request-in-flight", Title: "In flight", Status: 409}:           `"new_key_safe":false`,
		{Type: "about:blank", Status: 500, Extra: map[string]any{"trace": "x"}}:                       "",
		{Type: idem.ProblemTypeBase + "key-reused", Status: 422, Extra: map[string]any{"trace": "x"}}: `"new_key_safe":false`,
	} {
		rec := httptest.NewRecorder()
		p.Write(rec)
		if want == "" {
			require.NotContains(t, rec.Body.String(), "new_key_safe", p.Type)
		} else {
			require.Contains(t, rec.Body.String(), want, p.Type)
		}
	}
}

// Do refuses a scope no store can hold, before anything runs, saying why
// in one sentence (the three reasons read "the scope is longer than...",
// "is not valid UTF-8", "contains a NUL byte"; "the scope is contains" was
// sent once).
func TestDoUnstorableScopeSaysWhy(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, nil, idem.EngineOptions{})
	ran := false
	fn := func(context.Context) (idem.Result, error) { ran = true; return idem.Result{}, nil }
	for scope, why := range map[string]string{
		"a\x00b": "the scope contains a NUL byte",
		"\xff":   "the scope is not valid UTF-8",
		strings.Repeat("s", idem.MaxScopeLength+1): "the scope is longer than MaxScopeLength",
	} {
		rep, err := g.DoReport(t.Context(), idem.DoParams{Scope: scope, Key: "k"}, fn)
		require.ErrorIs(t, err, idem.ErrScopeUnstorable)
		require.ErrorContains(t, err, why)
		require.False(t, rep.NewKeySafe, "a server fault: the same key, or stop")
	}
	require.False(t, ran)
}

// ParseKey's errors say whether a new key is safe: not for a header
// repeated or a list (a client that adds the header on each retry sent its
// first attempt with one key), for a key that could never be claimed.
func TestParseKeyErrorsSayNewKeySafe(t *testing.T) {
	t.Parallel()
	for values, safe := range map[[2]string]bool{
		{"k0", "k0"}: false,
		{"k0, k0"}:   false,
		{`"a", "b"`}: false,
		{strings.Repeat("k", idem.MaxKeyLength+1)}: true,
		{"not a key"}: true,
	} {
		in := []string{values[0]}
		if values[1] != "" {
			in = append(in, values[1])
		}
		_, err := idem.ParseKey(in)
		require.ErrorIs(t, err, idem.ErrInvalidKey, "%q", in)
		require.Equal(t, safe, idem.NewKeySafe(err), "%q", in)
	}
}
