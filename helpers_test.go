package idem_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// openSQLite returns a migrated SQLite store on a file of the test's own,
// closed when the test ends.
func openSQLite(t testing.TB) *idemsqlite.Driver {
	t.Helper()
	return dbtest.SQLite(t)
}

// newMiddleware is idem.NewMiddleware for tests: a store of its own when
// store is nil, the single-tenant scope when cfg names none, and a silent
// logger.
func newMiddleware(t testing.TB, store idem.Store, cfg idem.Options) *idem.Middleware {
	t.Helper()
	if store == nil {
		store = openSQLite(t)
	}
	if cfg.Scope == nil {
		cfg.Scope = idem.SingleTenant
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = slog.New(slog.DiscardHandler)
	}
	mw, err := idem.NewMiddleware(store, cfg)
	require.NoError(t, err)
	return mw
}

// send serves one request through h: method and path, the key (none when
// empty) and the body; mutate may change the request before it is served.
func send(h http.Handler, method, path, key, body string, mutate ...func(*http.Request)) *httptest.ResponseRecorder {
	var rd io.Reader = strings.NewReader(body)
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	for _, f := range mutate {
		f(req)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// withContext makes send serve the request under ctx.
func withContext(ctx context.Context) func(*http.Request) {
	return func(r *http.Request) { *r = *r.WithContext(ctx) }
}

// counter is a protected handler that counts its runs and answers status
// (none written when 0: net/http's implicit 200), with no body. It is for
// requests served one at a time.
type counter struct {
	status int
	runs   int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.runs++
	if c.status != 0 {
		w.WriteHeader(c.status)
	}
}

// record reads the record of (scope, key) from store, failing t when the
// store cannot.
func record(t testing.TB, store idem.Store, scope, key string) idemdriver.Record {
	t.Helper()
	rec, err := store.Get(t.Context(), idemdriver.GetParams{Scope: scope, Key: key})
	require.NoError(t, err)
	return rec
}

// heldOwner serves, in its own goroutine, a POST /x of key through mw whose
// handler is held in flight until release is called; release then lets it
// answer 201 and returns that answer. h is the handler, for duplicates.
func heldOwner(mw *idem.Middleware, key string) (h http.Handler, release func() *httptest.ResponseRecorder) {
	started, held := make(chan struct{}), make(chan struct{})
	h = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-held
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- send(h, "POST", "/x", key, "{}") }()
	<-started
	return h, func() *httptest.ResponseRecorder { close(held); return <-done }
}
