package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/demotest"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/cmd/internal/supervise"
	"github.com/idemgo/idem/internal/dbtest"
)

// testServer is the whole service on httptest, on a fresh database.
type testServer struct {
	t        *testing.T
	url      string
	store    Store
	provider Provider
}

// openTestStore opens a migrated Store at databaseURL, as --database-url
// does; it is closed when t ends.
func openTestStore(t *testing.T, databaseURL string) Store {
	t.Helper()
	s, err := openStore(context.Background(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// newSQLiteStore opens a migrated Store on a fresh file in t's temp dir.
func newSQLiteStore(t *testing.T) Store {
	return openTestStore(t, "sqlite:"+filepath.Join(t.TempDir(), "paymentsd.db"))
}

// newPGTestStore opens a migrated Store on a fresh schema of the
// TEST_DATABASE_URL server (for example
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), through the
// same URL path as --database-url (search_path=<schema>). The schema is
// dropped when t ends. Without the variable the test skips, or fails under
// CI.
func newPGTestStore(t *testing.T) Store {
	url, _ := dbtest.PostgresURL(t)
	return openTestStore(t, url)
}

// newMySQLTestStore opens a migrated Store on a fresh database of the
// TEST_MYSQL_URL server (for example mysql://root@127.0.0.1:3306/test),
// through the same URL path as --database-url, dropped when t ends.
// Without the variable the test skips, or fails under CI.
func newMySQLTestStore(t *testing.T) Store {
	url, _ := dbtest.MySQLURL(t)
	return openTestStore(t, url)
}

// onEachDatabase runs test as a parallel subtest per kind of database
// (sqlite, postgres, mysql), each on a fresh Store.
func onEachDatabase(t *testing.T, test func(t *testing.T, store Store)) {
	for _, db := range []struct {
		name string
		open func(*testing.T) Store
	}{{"sqlite", newSQLiteStore}, {"postgres", newPGTestStore}, {"mysql", newMySQLTestStore}} {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			test(t, db.open(t))
		})
	}
}

// inEachWriteMode runs test as a parallel subtest per WriteMode (claim,
// separate).
func inEachWriteMode(t *testing.T, test func(t *testing.T, mode WriteMode)) {
	for _, mode := range []WriteMode{WriteInClaim, WriteSeparate} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

// startServer serves the API on store with provider (a FakeProvider with
// no latency when nil).
func startServer(t *testing.T, store Store, provider Provider) *testServer {
	t.Helper()
	if provider == nil {
		provider = NewFakeProvider(0)
	}
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close) // runs before the store's Close: registered later
	return &testServer{t: t, url: srv.URL, store: store, provider: provider}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// problem decodes an application/problem+json body.
func (r response) problem(t *testing.T) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var p map[string]any
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.EqualValues(t, r.status, p["status"])
	require.NotEmpty(t, p["type"])
	require.NotEmpty(t, p["title"])
	require.NotEmpty(t, p["detail"])
	return p
}

// json decodes an application/json body into v.
func (r response) json(t *testing.T, v any) {
	t.Helper()
	require.Equal(t, "application/json", r.header.Get("Content-Type"), "body: %s", r.body)
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

// do sends a request; headers are name, value pairs.
func (s *testServer) do(method, path, body string, headers ...string) response {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	require.NoError(s.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// auth is the Authorization header of merchant.
func auth(merchant string) string { return "Bearer " + service.APIKeyPrefix + merchant }

// postJSON creates a payment as merchant with key.
func (s *testServer) postJSON(merchant, key, body string) response {
	s.t.Helper()
	return s.do(http.MethodPost, "/v1/payments", body,
		"Authorization", auth(merchant), "Idempotency-Key", key, "Content-Type", "application/json")
}

func (s *testServer) get(merchant, path string) response {
	s.t.Helper()
	return s.do(http.MethodGet, path, "", "Authorization", auth(merchant))
}

type balanceJSON struct {
	Merchant string           `json:"merchant"`
	Payments int64            `json:"payments"`
	Totals   map[string]int64 `json:"totals"`
}

func (s *testServer) balance(merchant string) balanceJSON {
	s.t.Helper()
	r := s.get(merchant, "/v1/balance")
	require.Equal(s.t, http.StatusOK, r.status, "body: %s", r.body)
	var b balanceJSON
	r.json(s.t, &b)
	return b
}

// invalidParamNames lists the names in a problem's invalid-params member.
func invalidParamNames(t *testing.T, p map[string]any) []string {
	t.Helper()
	list, ok := p["invalid-params"].([]any)
	require.True(t, ok, "no invalid-params in %v", p)
	var names []string
	for _, item := range list {
		m := item.(map[string]any)
		require.NotEmpty(t, m["reason"])
		names = append(names, m["name"].(string))
	}
	return names
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startRun runs the command as main does, with args and --addr on a free
// port, its log in a file, and waits until its /healthz answers 200. stop
// cancels run's context (as SIGINT/SIGTERM do), requires run to return nil
// within 20 s, and returns the log.
func startRun(t *testing.T, args ...string) (s *testServer, stop func() string) {
	t.Helper()
	addr := freeTestAddr(t)
	logFile, logs := tempLog(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"--addr", addr}, args...), logFile) }()

	s = &testServer{t: t, url: "http://" + addr}
	healthy := func() bool {
		resp, err := http.Get(s.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !assert.Eventually(t, healthy, 30*time.Second, 20*time.Millisecond) {
		t.Fatalf("run is not healthy; its log:\n%s", logs())
	}
	return s, func() string {
		t.Helper()
		cancel()
		demotest.RequireReturns(t, done, 20*time.Second, "run did not return after its context was cancelled")
		return logs()
	}
}

// tempLog returns a new file in t's temporary directory to log to (any
// number of goroutines may write to it), and a function that reads it.
func tempLog(t *testing.T) (w *os.File, read func() string) {
	t.Helper()
	w, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	return w, func() string {
		b, err := os.ReadFile(w.Name())
		require.NoError(t, err)
		return string(b)
	}
}

// freeTestAddr returns a loopback address with a free port (supervise.FreeAddr).
func freeTestAddr(t *testing.T) string {
	t.Helper()
	addr, err := supervise.FreeAddr()
	require.NoError(t, err)
	return addr
}
