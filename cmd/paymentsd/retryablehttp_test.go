package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
)

// inFlightServer is paymentsd on httptest whose provider holds the first
// charge until release is called, counting the 409s it answers.
type inFlightServer struct {
	*testServer
	provider  gatedProvider
	conflicts atomic.Int64
	first     chan response
}

// startInFlight starts the server and a first POST /v1/payments with key,
// and returns once its charge is held: the key is in flight.
func startInFlight(t *testing.T, key string) *inFlightServer {
	t.Helper()
	s := &inFlightServer{provider: gatedProvider{NewFakeProvider(0), make(chan struct{}, 1), make(chan struct{})}, first: make(chan response, 1)}
	h, err := newHandler(handlerConfig{Store: newSQLiteStore(t), Provider: s.provider, Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(statusCounter{w, &s.conflicts}, r)
	}))
	t.Cleanup(srv.Close)
	s.testServer = &testServer{t: t, url: srv.URL}
	go func() { s.first <- s.postJSON("acme", key, paymentBody) }()
	<-s.provider.entered
	return s
}

// statusCounter counts the 409s written through it.
type statusCounter struct {
	http.ResponseWriter
	conflicts *atomic.Int64
}

func (s statusCounter) WriteHeader(status int) {
	if status == http.StatusConflict {
		s.conflicts.Add(1)
	}
	s.ResponseWriter.WriteHeader(status)
}

// retryableRequest is the POST /v1/payments that the first one is, as
// go-retryablehttp sends it.
func (s *inFlightServer) retryableRequest(t *testing.T, key string) *retryablehttp.Request {
	req, err := retryablehttp.NewRequest(http.MethodPost, s.url+"/v1/payments", strings.NewReader(paymentBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", auth("acme"))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// TestRetryableHTTPDefaultPolicyStopsAtAConflict: go-retryablehttp's own
// policy does not retry a 409, so a duplicate sent while the first request
// is in flight gets the 409 after one attempt (what docs/clients.md warns
// of).
func TestRetryableHTTPDefaultPolicyStopsAtAConflict(t *testing.T) {
	t.Parallel()
	s := startInFlight(t, "rh-1")
	client := retryablehttp.NewClient()
	client.Logger = nil
	client.RetryMax = 5
	resp, err := client.Do(s.retryableRequest(t, "rh-1"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, int64(1), s.conflicts.Load())
	close(s.provider.gate)
	require.Equal(t, http.StatusCreated, (<-s.first).status)
}

// TestRetryableHTTPWithIdemclientCheckRetry: idemclient.DefaultCheckRetry as
// go-retryablehttp's CheckRetry (and idemclient.DefaultBackoff, which
// honours the 409's Retry-After) retries a duplicate in flight, with the
// same Idempotency-Key, until it gets the first request's replay; one
// charge.
func TestRetryableHTTPWithIdemclientCheckRetry(t *testing.T) {
	t.Parallel()
	s := startInFlight(t, "rh-2")
	client := retryablehttp.NewClient()
	client.Logger = nil
	client.RetryMax = 20
	client.CheckRetry = idemclient.DefaultCheckRetry
	client.Backoff = func(_, _ time.Duration, attempt int, resp *http.Response) time.Duration {
		return idemclient.DefaultBackoff(attempt+1, resp)
	}
	var keys []string
	client.RequestLogHook = func(_ retryablehttp.Logger, r *http.Request, _ int) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
	}
	type result struct {
		resp *http.Response
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Do(s.retryableRequest(t, "rh-2"))
		if err != nil {
			done <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{resp: resp, body: string(b), err: err}
	}()
	// The duplicate met the key in flight twice, then the first finishes.
	require.Eventually(t, func() bool { return s.conflicts.Load() >= 2 }, 30*time.Second, 10*time.Millisecond)
	close(s.provider.gate)
	first := <-s.first
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusCreated, r.resp.StatusCode, "body: %s", r.body)
	assert.Equal(t, "true", r.resp.Header.Get(idem.HeaderReplayed))
	assert.Equal(t, string(first.body), r.body)
	assert.GreaterOrEqual(t, len(keys), 3, "attempts")
	for _, k := range keys {
		assert.Equal(t, "rh-2", k, "go-retryablehttp changed the key across retries")
	}
	assert.Equal(t, 1, s.provider.Charges())
}

// TestRetryableHTTPGetsTheReplayWithAServerWait is issue 22's case: with a
// server default wait of 5 s (--wait), two callers using go-retryablehttp's
// default policy and a 1 s client timeout against a 2.5 s payment both get
// 201 with Idempotent-Replayed: true. The server never answers 409: each
// attempt that meets the payment in flight waits for it; an attempt the
// client abandoned is retried by its policy and meets the same wait, or the
// stored outcome. One charge. (A waiter whose client has gone stops
// waiting and is answered 409 that nobody reads: the statuses counted are
// the ones the clients received.)
func TestRetryableHTTPGetsTheReplayWithAServerWait(t *testing.T) {
	t.Parallel()
	provider := NewFakeProvider(2500 * time.Millisecond)
	h, err := newHandler(handlerConfig{Store: newSQLiteStore(t), Provider: provider, Logger: discardLogger(), Wait: 5 * time.Second})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	var conflicts, attempts atomic.Int64
	s := &inFlightServer{testServer: &testServer{t: t, url: srv.URL}}
	type result struct {
		status   int
		replayed string
		body     string
		err      error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			client := retryablehttp.NewClient() // its default policy and backoff
			client.Logger = nil
			client.HTTPClient.Timeout = time.Second
			client.ResponseLogHook = func(_ retryablehttp.Logger, resp *http.Response) {
				attempts.Add(1)
				if resp.StatusCode == http.StatusConflict {
					conflicts.Add(1)
				}
			}
			resp, err := client.Do(s.retryableRequest(t, "rh-wait"))
			if err != nil {
				results <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{status: resp.StatusCode, replayed: resp.Header.Get(idem.HeaderReplayed), body: string(b), err: err}
		}()
	}
	var bodies []string
	for range 2 {
		r := <-results
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		assert.Equal(t, "true", r.replayed, "every caller's answer is the replay of the payment's first execution")
		bodies = append(bodies, r.body)
	}
	assert.Equal(t, bodies[0], bodies[1])
	assert.Zero(t, conflicts.Load(), "no caller received a 409 in %d answers", attempts.Load())
	assert.Equal(t, 1, provider.Charges())
}
