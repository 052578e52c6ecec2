// Package adaptertest is the suite every framework adapter (adapters/idemgin,
// adapters/idemecho, ...) passes: the same requests, against the real
// framework, on a fresh store per case (SQLite always, PostgreSQL through
// TEST_DATABASE_URL, which fails rather than skips when CI is set).
//
// An adapter's test builds its framework's app with Build, wiring the routes
// below to the App's business methods in the framework's own style, and calls
// Run. The suite then checks what naive glue breaks: one
// execution per claim under concurrent duplicates, errors returned the
// framework's way recorded with their real status and body, panics recorded
// FAILED (the retry runs again), 422 for a reused key, and byte-exact replay.
package adaptertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// Scope is the scope every request of the suite runs in.
const Scope = "merchant_42"

// Messages of the routes' framework errors; the suite looks for them in the
// response bodies the framework's error handling writes.
const (
	DeclinedMessage    = "card declined"
	UnavailableMessage = "provider unavailable"
)

// App is the business behind the routes an adapter's test serves with its
// framework, the idem middleware applied through the adapter under test:
//
//   - POST /charges: n, err := app.Charge(ctx); on error answer 500. Else set
//     the headers of ChargeHeaders(n) and answer 201 with the framework's JSON
//     renderer: {"charge": n, "amount": <the request body's "amount">}.
//   - POST /declined: app.Decline(ctx), then return or raise the framework's
//     error with status 402 and the message DeclinedMessage.
//   - POST /unavailable: app.Unavailable(ctx), then the framework's error with
//     status 503 and the message UnavailableMessage.
//   - POST /panic: app.Panic(ctx), which panics; the framework's own recovery
//     middleware, registered outside the adapter, answers it.
//
// ctx is the request's context as the framework handler sees it: each method
// counts the run, and fails (or, for Panic, panics with another value) when
// ctx does not carry idem's Execution, that is when the handler did not run
// inside idem's handler.
type App struct {
	Charges, Declines, Unavailables, Panics atomic.Int64

	// When hold is set, Charge sends on entered (without blocking) and
	// waits for hold to close.
	hold, entered chan struct{}
}

// errNoExecution says the framework handler ran outside idem's handler.
var errNoExecution = errors.New("adaptertest: the handler's context carries no idem Execution: it ran outside idem's handler")

// executed counts a run, inside idem's handler or not.
func executed(ctx context.Context, n *atomic.Int64) (int64, error) {
	c := n.Add(1)
	if _, ok := idem.ExecutionFromContext(ctx); !ok {
		return c, errNoExecution
	}
	return c, nil
}

// Charge counts one execution of POST /charges and returns its number.
func (a *App) Charge(ctx context.Context) (int64, error) {
	n, err := executed(ctx, &a.Charges)
	if a.hold != nil {
		select {
		case a.entered <- struct{}{}:
		default:
		}
		<-a.hold
	}
	return n, err
}

// Decline counts one execution of POST /declined.
func (a *App) Decline(ctx context.Context) error { _, err := executed(ctx, &a.Declines); return err }

// Unavailable counts one execution of POST /unavailable.
func (a *App) Unavailable(ctx context.Context) error {
	_, err := executed(ctx, &a.Unavailables)
	return err
}

// PanicValue is what Panic panics with.
const PanicValue = "adaptertest: handler panic"

// Panic counts one execution of POST /panic and panics.
func (a *App) Panic(ctx context.Context) {
	if _, err := executed(ctx, &a.Panics); err != nil {
		panic(err)
	}
	panic(PanicValue)
}

// ChargeHeaders are the headers POST /charges sets for charge n: Location and
// ETag are on idem's replay allow-list, Set-Cookie never is (CONTRACT section
// 5), X-Charge-Trace is not on the list.
func ChargeHeaders(n int64) http.Header {
	return http.Header{
		"Location":       {fmt.Sprintf("/charges/%d", n)},
		"Etag":           {fmt.Sprintf(`"charge-%d"`, n)},
		"Set-Cookie":     {fmt.Sprintf("session=s%d; Path=/", n)},
		"X-Charge-Trace": {fmt.Sprintf("trace-%d", n)},
	}
}

// ChargeRequest is the JSON body of POST /charges.
type ChargeRequest struct {
	Amount int64 `json:"amount"`
}

// Build returns the framework's app serving App's routes with mw applied
// through the adapter under test.
type Build func(t *testing.T, mw *idem.Middleware, app *App) http.Handler

// Stores are the stores the suite runs on, by name: a fresh SQLite file, and
// a fresh PostgreSQL schema on TEST_DATABASE_URL.
var Stores = map[string]func(t *testing.T) idem.Store{
	"sqlite":   SQLite,
	"postgres": Postgres,
}

// SQLite returns a migrated store on a fresh SQLite file.
func SQLite(t *testing.T) idem.Store {
	t.Helper()
	s, err := idemsqlite.Open(context.Background(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// Postgres returns a migrated store on a fresh schema of TEST_DATABASE_URL's
// server (skipped without it, failed under CI), through a pool of at most 4
// connections: the server is shared, and requests beyond 4 wait for one.
func Postgres(t *testing.T) idem.Store {
	t.Helper()
	s := idempgx.New(postgresPool(t))
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// PostgresPartitioned is Postgres with idem_keys partitioned by expires_at
// (idempgx.NewPartitioned): its partition is found through the fresh
// schema, the pool's search_path.
func PostgresPartitioned(t *testing.T) idem.Store {
	t.Helper()
	s := idempgx.NewPartitioned(postgresPool(t), idempgx.PartitionConfig{})
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

func postgresPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url, _ := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the schema's drop
	return pool
}

// NewMiddleware returns idem's middleware on store, every request in Scope,
// the other settings at their defaults.
func NewMiddleware(t *testing.T, store idem.Store) *idem.Middleware {
	t.Helper()
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: func(*http.Request) (string, error) { return Scope, nil }})
	require.NoError(t, err)
	return mw
}

// server starts build's app on a fresh store and a real HTTP server.
func server(t *testing.T, store func(*testing.T) idem.Store, build Build) (*httptest.Server, *App) {
	t.Helper()
	mw := NewMiddleware(t, store(t))
	app := &App{}
	srv := httptest.NewServer(build(t, mw, app))
	t.Cleanup(srv.Close)
	return srv, app
}

// Response is one answer as the client read it.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Post sends a POST with key (none when empty) and a JSON body, and reads
// the answer; it fails t on a transport error.
func Post(t *testing.T, url, key, body string) Response {
	t.Helper()
	r, err := post(url, key, body)
	require.NoError(t, err)
	return r
}

// Twice posts the same request ({} with key) twice and returns both answers.
func Twice(t *testing.T, url, key string) (first, second Response) {
	t.Helper()
	return Post(t, url, key, `{}`), Post(t, url, key, `{}`)
}

// post is Post for goroutines other than the test's.
func post(url, key, body string) (Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Response{}, err
	}
	b, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

// ProblemType returns the type member of a problem details body, less
// idem.ProblemTypeBase; it fails t unless r is application/problem+json.
func ProblemType(t *testing.T, r Response) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "body: %s", r.Body)
	var p struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &p), "body: %s", r.Body)
	return strings.TrimPrefix(p.Type, idem.ProblemTypeBase)
}

// Run runs the suite against build on every store of Stores.
func Run(t *testing.T, build Build) {
	for name, store := range Stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			RunOn(t, store, build)
		})
	}
}

// RunOn runs the suite against build on one store.
func RunOn(t *testing.T, store func(*testing.T) idem.Store, build Build) {
	t.Run("ConcurrentDuplicates", func(t *testing.T) {
		// 2 keys, 12 concurrent requests each (the storm in which naive gin
		// glue ran the handler 22 times): exactly one execution per key;
		// every other request gets 409 request-in-flight or the replay.
		srv, app := server(t, store, build)
		const keys, perKey = 2, 12
		var wg sync.WaitGroup
		start := make(chan struct{})
		got := make([][]Response, keys)
		errs := make([]error, keys*perKey)
		for k := range keys {
			got[k] = make([]Response, perKey)
			for i := range perKey {
				wg.Go(func() {
					<-start
					got[k][i], errs[k*perKey+i] = post(srv.URL+"/charges", fmt.Sprintf("storm-%d", k), `{"amount":1000}`)
				})
			}
		}
		close(start)
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		require.EqualValues(t, keys, app.Charges.Load(), "one execution per key")
		for k := range keys {
			var originals int
			var body []byte
			for _, r := range got[k] {
				switch r.Status {
				case http.StatusCreated:
					if r.Header.Get(idem.HeaderReplayed) == "" {
						originals++
					}
					if body == nil {
						body = r.Body
					}
					require.Equal(t, string(body), string(r.Body), "every 201 of one key carries the same charge")
				case http.StatusConflict:
					require.Equal(t, "request-in-flight", ProblemType(t, r))
					require.NotEmpty(t, r.Header.Get("Retry-After"))
				default:
					t.Fatalf("key %d: status %d, body %s", k, r.Status, r.Body)
				}
			}
			require.Equal(t, 1, originals, "key %d: exactly one request ran the handler", k)
		}
	})

	t.Run("DuplicatesWhileInFlight", func(t *testing.T) {
		// The execution is held until every duplicate has been answered:
		// each one must be a 409 request-in-flight, none may run the
		// handler. A second execution would be held too, and the wait
		// below would end at its deadline (a bound on the test, not a
		// speed check).
		srv, app := server(t, store, build)
		app.hold, app.entered = make(chan struct{}), make(chan struct{}, 1)
		release := sync.OnceFunc(func() { close(app.hold) })
		t.Cleanup(release) // before the server's Close, which waits for the handlers
		const dups = 8
		// held posts the held request, and sends the answer (a transport
		// error as its body) on out.
		held := func(out chan<- Response) {
			r, err := post(srv.URL+"/charges", "held", `{"amount":1000}`)
			if err != nil {
				r.Body = []byte(err.Error())
			}
			out <- r
		}
		first := make(chan Response, 1)
		go held(first)
		answers := make(chan Response, dups)
		deadline := time.After(60 * time.Second)
		select {
		case <-app.entered:
		case r := <-first:
			t.Fatalf("the held request answered %d: %s", r.Status, r.Body)
		case <-deadline:
			t.Fatal("the held request never reached the handler")
		}
		for range dups {
			go held(answers)
		}
		for i := range dups {
			select {
			case r := <-answers:
				require.Equal(t, http.StatusConflict, r.Status, "duplicate %d: body %s", i, r.Body)
				require.Equal(t, "request-in-flight", ProblemType(t, r))
			case <-deadline:
				t.Fatalf("%d of %d duplicates answered; executions: %d", i, dups, app.Charges.Load())
			}
		}
		release()
		r := <-first
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		require.EqualValues(t, 1, app.Charges.Load())
		replay := Post(t, srv.URL+"/charges", "held", `{"amount":1000}`)
		require.Equal(t, "true", replay.Header.Get(idem.HeaderReplayed))
		require.Equal(t, r.Body, replay.Body)
	})

	t.Run("ReplayFidelity", func(t *testing.T) {
		srv, app := server(t, store, build)
		first := Post(t, srv.URL+"/charges", "fidelity", `{"amount":1000}`)
		require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
		require.Empty(t, first.Header.Get(idem.HeaderReplayed))
		require.JSONEq(t, `{"charge":1,"amount":1000}`, string(first.Body))
		for k, v := range ChargeHeaders(1) {
			require.Equal(t, v, first.Header.Values(k), "the first caller gets every header the handler set: %s", k)
		}
		replay := Post(t, srv.URL+"/charges", "fidelity", `{ "amount": 1000 }`) // same JSON
		require.Equal(t, first.Status, replay.Status)
		require.Equal(t, "true", replay.Header.Get(idem.HeaderReplayed))
		require.Equal(t, first.Body, replay.Body, "byte-exact body")
		for _, k := range []string{"Content-Type", "Location", "Etag"} {
			require.Equal(t, first.Header.Values(k), replay.Header.Values(k), "allow-listed header %s", k)
		}
		require.Empty(t, replay.Header.Values("Set-Cookie"), "Set-Cookie is never replayed")
		require.Empty(t, replay.Header.Values("X-Charge-Trace"), "a header off the allow-list is not replayed")
		require.EqualValues(t, 1, app.Charges.Load())
	})

	t.Run("KeyReused", func(t *testing.T) {
		srv, app := server(t, store, build)
		require.Equal(t, http.StatusCreated, Post(t, srv.URL+"/charges", "reused", `{"amount":1000}`).Status)
		r := Post(t, srv.URL+"/charges", "reused", `{"amount":9999}`)
		require.Equal(t, http.StatusUnprocessableEntity, r.Status)
		require.Equal(t, "key-reused", ProblemType(t, r))
		r = Post(t, srv.URL+"/declined", "reused", `{"amount":1000}`)
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, "another path: body %s", r.Body)
		require.EqualValues(t, 1, app.Charges.Load())
		require.EqualValues(t, 0, app.Declines.Load())
	})

	t.Run("MissingKey", func(t *testing.T) {
		srv, app := server(t, store, build)
		r := Post(t, srv.URL+"/charges", "", `{"amount":1000}`)
		require.Equal(t, http.StatusBadRequest, r.Status)
		require.Equal(t, "missing-key", ProblemType(t, r))
		require.EqualValues(t, 0, app.Charges.Load())
	})

	t.Run("FrameworkErrorRecorded", func(t *testing.T) {
		// A 4xx error returned the framework's way is an outcome: recorded
		// with its real status and body, replayed, not run again.
		srv, app := server(t, store, build)
		first := Post(t, srv.URL+"/declined", "declined", `{"amount":1000}`)
		require.Equal(t, http.StatusPaymentRequired, first.Status, "body: %s", first.Body)
		require.Contains(t, string(first.Body), DeclinedMessage)
		replay := Post(t, srv.URL+"/declined", "declined", `{"amount":1000}`)
		require.Equal(t, http.StatusPaymentRequired, replay.Status)
		require.Equal(t, "true", replay.Header.Get(idem.HeaderReplayed))
		require.Equal(t, first.Body, replay.Body)
		require.Equal(t, first.Header.Get("Content-Type"), replay.Header.Get("Content-Type"))
		require.EqualValues(t, 1, app.Declines.Load())
	})

	t.Run("FrameworkErrorRetryable", func(t *testing.T) {
		// A 503 returned the framework's way is FAILED (CONTRACT section 5):
		// the retry runs the handler again.
		srv, app := server(t, store, build)
		requireRunsAgain(t, srv.URL+"/unavailable", http.StatusServiceUnavailable, UnavailableMessage)
		require.EqualValues(t, 2, app.Unavailables.Load())
	})

	t.Run("Panic", func(t *testing.T) {
		// A panic releases the claim (FAILED, CONTRACT section 5): the
		// framework's recovery answers 500, and the retry runs again
		// instead of meeting a 409 for a whole lease.
		srv, app := server(t, store, build)
		requireRunsAgain(t, srv.URL+"/panic", http.StatusInternalServerError, "")
		require.EqualValues(t, 2, app.Panics.Load())
	})
}

// requireRunsAgain posts the same request to url twice; each answer must be
// status, not a replay, with a body containing message ("" for any body).
func requireRunsAgain(t *testing.T, url string, status int, message string) {
	t.Helper()
	for i := range 2 {
		r := Post(t, url, "again", `{"amount":1000}`)
		require.Equal(t, status, r.Status, "attempt %d: body %s", i+1, r.Body)
		require.Contains(t, string(r.Body), message)
		require.Empty(t, r.Header.Get(idem.HeaderReplayed))
	}
}
