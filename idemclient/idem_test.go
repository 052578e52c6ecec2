package idemclient_test

import (
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

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
	"github.com/idemgo/idem/internal/dbtest"
)

// Eight clients send the same request with the same key while the first run
// is held: the seven others get idem's 409 and retry through it, then get
// the replay. Every caller sees 201; the handler runs once.
func TestAgainstIdem(t *testing.T) {
	t.Parallel()
	const clients = 8
	ctx := t.Context()
	mw := newMiddleware(t)

	var runs atomic.Int32
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if n == 1 {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"payment":%d}`, n) // a write error means the client is gone
	})))
	t.Cleanup(srv.Close)

	// Which clients (by the X-Client header) have been answered 409.
	var mu sync.Mutex
	saw409 := map[string]bool{}
	all409 := make(chan struct{})
	tr, err := idemclient.New(idemclient.Config{
		// idem's 409 says Retry-After: 1 s at least: poll sooner.
		MaxRetryAfter: 5 * time.Millisecond,
		MaxAttempts:   10000,
		OnAttempt: func(ai idemclient.AttemptInfo) {
			if ai.Status != http.StatusConflict {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			c := ai.Request.Header.Get("X-Client")
			if saw409[c] {
				return
			}
			saw409[c] = true
			if len(saw409) == clients-1 {
				close(all409)
			}
		},
	})
	require.NoError(t, err)
	client := &http.Client{Transport: tr}

	type result struct {
		status   int
		replayed bool
		body     string
		err      error
	}
	results := make(chan result, clients)
	for i := range clients {
		go func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/payments",
				strings.NewReader(`{"amount":1000,"currency":"JPY"}`))
			if err != nil {
				results <- result{err: err}
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idemclient.HeaderKey, "order-1001")
			req.Header.Set("X-Client", fmt.Sprint(i))
			resp, err := client.Do(req)
			if err != nil {
				results <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			err = errors.Join(err, resp.Body.Close())
			results <- result{status: resp.StatusCode, replayed: idemclient.Replayed(resp), body: string(b), err: err}
		}()
	}

	select {
	case <-all409:
	case <-time.After(30 * time.Second):
		t.Fatal("the other clients were not all answered 409 while the first run was held")
	}
	require.EqualValues(t, 1, runs.Load(), "the 409s did not run the handler")
	releaseOnce.Do(func() { close(release) })

	replays := 0
	for range clients {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, `{"payment":1}`, r.body)
		if r.replayed {
			replays++
		}
	}
	require.Equal(t, clients-1, replays)
	require.EqualValues(t, 1, runs.Load(), "the handler ran exactly once")
}

// A reused key with another body gets idem's 422, which is not retried.
func TestAgainstIdemKeyReusedNotRetried(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t)
	var runs atomic.Int32
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)

	var attempts atomic.Int32
	tr, _ := newTransport(t, idemclient.Config{OnAttempt: func(idemclient.AttemptInfo) { attempts.Add(1) }})
	key := http.Header{idemclient.HeaderKey: {"order-7"}}
	resp, _, err := do(t, tr, http.MethodPost, srv.URL, `{"amount":1}`, key)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, body, err := do(t, tr, http.MethodPost, srv.URL, `{"amount":2}`, key)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Contains(t, body, "key-reused")
	require.EqualValues(t, 2, attempts.Load())
	require.EqualValues(t, 1, runs.Load())
}

// newMiddleware returns idem's middleware, single-tenant, on a migrated
// SQLite store in the test's temporary directory, closed when the test ends.
func newMiddleware(t *testing.T) *idem.Middleware {
	t.Helper()
	mw, err := idem.NewMiddleware(dbtest.SQLite(t), idem.Options{Scope: idem.SingleTenant})
	require.NoError(t, err)
	return mw
}
