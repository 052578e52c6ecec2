package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
)

func TestHeaderNamesMatchCore(t *testing.T) {
	t.Parallel()
	require.Equal(t, idem.HeaderKey, idemclient.HeaderKey)
	require.Equal(t, idem.HeaderReplayed, idemclient.HeaderReplayed)
}

func TestKeyAddedAndKeptAcrossRetries(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		t.Run(method, func(t *testing.T) {
			srv := newServer(t, statuses(nil, 503, 409, 201))
			tr, sl := newTransport(t, idemclient.Config{})

			req := newRequest(t, t.Context(), method, srv.URL, strings.NewReader(`{"amount":1000}`))
			req.Header.Set("Content-Type", "application/json")
			before := req.Header.Clone()
			resp, _ := roundTrip(t, tr, req)

			require.Equal(t, http.StatusCreated, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 3)
			require.Len(t, hits[0].Keys, 1)
			key := hits[0].Keys[0]
			id, err := uuid.Parse(key)
			require.NoError(t, err)
			require.Equal(t, uuid.Version(7), id.Version())
			for _, h := range hits {
				require.Equal(t, []string{key}, h.Keys, "every attempt sends the same key")
				require.Equal(t, method, h.Method)
			}
			require.Equal(t, key, idemclient.KeyFromResponse(resp))
			require.Equal(t, before, req.Header, "the caller's request is not modified")
			require.Len(t, sl.Waits(), 2)
		})
	}
}

func TestEachRequestGetsItsOwnKey(t *testing.T) {
	t.Parallel()
	srv := newServer(t, statuses(nil, 201))
	tr, _ := newTransport(t, idemclient.Config{})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			_, _, err := do(t, tr, http.MethodPost, srv.URL, "{}", nil)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, h := range srv.Hits() {
		require.Len(t, h.Keys, 1)
		seen[h.Keys[0]] = true
	}
	require.Len(t, seen, 20)
}

func TestCallerKeyKept(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"order-1001", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`} {
		t.Run(key, func(t *testing.T) {
			srv := newServer(t, statuses(nil, 409, 201))
			tr, _ := newTransport(t, idemclient.Config{})
			resp, _, err := do(t, tr, http.MethodPost, srv.URL, "{}", http.Header{idemclient.HeaderKey: {key}})
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 2)
			for _, h := range hits {
				require.Equal(t, []string{key}, h.Keys)
			}
			require.Equal(t, key, idemclient.KeyFromResponse(resp))
		})
	}
}

func TestAnyMethodWithCallerKeyIsRetried(t *testing.T) {
	t.Parallel()
	srv := newServer(t, statuses(nil, 503, 200))
	tr, _ := newTransport(t, idemclient.Config{RetryMethods: []string{}})
	resp, _, err := do(t, tr, "CHARGE", srv.URL, "x", http.Header{idemclient.HeaderKey: {"k-1"}})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, srv.Hits(), 2)
}

func TestNoKeyOnGET(t *testing.T) {
	t.Parallel()
	srv := newServer(t, statuses(nil, 503, 200))
	tr, _ := newTransport(t, idemclient.Config{})
	resp, _, err := do(t, tr, http.MethodGet, srv.URL, "", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	hits := srv.Hits()
	require.Len(t, hits, 2, "GET is idempotent (RFC 9110 section 9.2.2): retried")
	for _, h := range hits {
		require.Empty(t, h.Keys)
	}
	require.Empty(t, idemclient.KeyFromResponse(resp))
}

func TestMethodsOutsideTheListsAreSentOnce(t *testing.T) {
	t.Parallel()
	t.Run("GET with RetryMethods empty", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 503, 200))
		tr, sl := newTransport(t, idemclient.Config{RetryMethods: []string{}})
		resp, body, err := do(t, tr, http.MethodGet, srv.URL, "", nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "Service Unavailable", body)
		require.Len(t, srv.Hits(), 1)
		require.Empty(t, sl.Waits())
	})
	t.Run("POST when KeyMethods is PATCH only", func(t *testing.T) {
		ex := post(t, idemclient.Config{KeyMethods: []string{"patch"}}, statuses(nil, 503, 201))
		require.Equal(t, http.StatusServiceUnavailable, ex.resp.StatusCode)
		require.Len(t, ex.hits, 1)
		require.Empty(t, ex.hits[0].Keys)
	})
}

func TestRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, code := range []int{409, 429, 502, 503, 504} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			ex := post(t, idemclient.Config{}, statuses(nil, code, 201))
			require.Equal(t, http.StatusCreated, ex.resp.StatusCode)
			require.Equal(t, "Created", ex.body)
			require.Len(t, ex.hits, 2)
			require.Len(t, ex.waits, 1)
		})
	}
}

func TestNotRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, code := range []int{200, 201, 301, 400, 401, 403, 404, 408, 410, 413, 422, 500, 501} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := newServer(t, statuses(nil, code, 201))
			tr, sl := newTransport(t, idemclient.Config{})
			// No http.Client: a 301 is not followed.
			resp, body := roundTrip(t, tr, newRequest(t, t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}")))
			require.Equal(t, code, resp.StatusCode)
			require.Equal(t, http.StatusText(code), body, "the response reaches the caller unread")
			require.Len(t, srv.Hits(), 1)
			require.Empty(t, sl.Waits())
		})
	}
}

func TestRetryAfterSecondsHonouredAndCapped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		retryAfter    string
		maxRetryAfter time.Duration
		want          time.Duration
	}{
		{"seconds", "3", 0, 3 * time.Second},
		{"seconds capped", "120", 5 * time.Second, 5 * time.Second},
		{"default cap 5s", "3600", 0, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := post(t, idemclient.Config{MaxRetryAfter: tc.maxRetryAfter}, statuses(http.Header{"Retry-After": {tc.retryAfter}}, 503, 201))
			require.Equal(t, http.StatusCreated, ex.resp.StatusCode)
			require.Equal(t, []time.Duration{tc.want}, ex.waits)
		})
	}
}

func TestRetryAfterHTTPDateHonouredAndCapped(t *testing.T) {
	t.Parallel()
	date := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	t.Run("honoured", func(t *testing.T) {
		ex := post(t, idemclient.Config{MaxRetryAfter: 2 * time.Hour, MaxElapsed: 3 * time.Hour}, statuses(http.Header{"Retry-After": {date}}, 429, 201))
		require.Equal(t, http.StatusCreated, ex.resp.StatusCode)
		require.Len(t, ex.waits, 1)
		// The date has whole-second resolution and the test takes some time.
		require.LessOrEqual(t, ex.waits[0], time.Hour)
		require.Greater(t, ex.waits[0], time.Hour-time.Minute)
	})
	t.Run("capped", func(t *testing.T) {
		ex := post(t, idemclient.Config{MaxRetryAfter: 10 * time.Second}, statuses(http.Header{"Retry-After": {date}}, 429, 201))
		require.Equal(t, []time.Duration{10 * time.Second}, ex.waits)
	})
	t.Run("past date falls back to the jittered backoff", func(t *testing.T) {
		past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
		ex := post(t, idemclient.Config{BaseDelay: 40 * time.Millisecond}, statuses(http.Header{"Retry-After": {past}}, 503, 201))
		require.Len(t, ex.waits, 1)
		require.GreaterOrEqual(t, ex.waits[0], time.Duration(0))
		require.Less(t, ex.waits[0], 40*time.Millisecond)
	})
}

func TestWaitPastDeadlineIsNotTaken(t *testing.T) {
	t.Parallel()
	retryAfter := http.Header{"Retry-After": {"7200"}} // 2 h
	t.Run("context deadline", func(t *testing.T) {
		srv := newServer(t, statuses(retryAfter, 503, 201))
		tr, sl := newTransport(t, idemclient.Config{MaxRetryAfter: 3 * time.Hour, MaxElapsed: 3 * time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		resp, body := roundTrip(t, tr, newRequest(t, ctx, http.MethodPost, srv.URL, strings.NewReader("{}")))
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the last response is returned instead of sleeping")
		require.Equal(t, "Service Unavailable", body)
		require.Empty(t, sl.Waits())
		require.Len(t, srv.Hits(), 1)
	})
	t.Run("http.Client Timeout", func(t *testing.T) {
		srv := newServer(t, statuses(retryAfter, 503, 201))
		tr, sl := newTransport(t, idemclient.Config{MaxRetryAfter: 3 * time.Hour, MaxElapsed: 3 * time.Hour})
		req := newRequest(t, t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}"))
		resp, err := (&http.Client{Transport: tr, Timeout: time.Hour}).Do(req)
		require.NoError(t, err)
		readBody(t, resp)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Empty(t, sl.Waits())
	})
	t.Run("MaxElapsed", func(t *testing.T) {
		ex := post(t, idemclient.Config{MaxRetryAfter: 3 * time.Hour, MaxElapsed: time.Hour}, statuses(retryAfter, 503, 201))
		require.Equal(t, http.StatusServiceUnavailable, ex.resp.StatusCode)
		require.Empty(t, ex.waits)
		require.Len(t, ex.hits, 1)
	})
}

func TestAttemptsBounded(t *testing.T) {
	t.Parallel()
	t.Run("statuses", func(t *testing.T) {
		ex := post(t, idemclient.Config{MaxAttempts: 4}, statuses(nil, 503))
		require.Equal(t, http.StatusServiceUnavailable, ex.resp.StatusCode)
		require.Equal(t, "Service Unavailable", ex.body)
		require.Len(t, ex.hits, 4)
		require.Len(t, ex.waits, 3)
	})
	t.Run("default 60", func(t *testing.T) {
		ex := post(t, idemclient.Config{}, statuses(nil, 409))
		require.Equal(t, http.StatusConflict, ex.resp.StatusCode)
		require.Len(t, ex.hits, idemclient.DefaultMaxAttempts)
		require.Len(t, ex.waits, idemclient.DefaultMaxAttempts-1)
	})
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		url := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())

		var attempts atomic.Int32
		tr, sl := newTransport(t, idemclient.Config{MaxAttempts: 3, OnAttempt: func(idemclient.AttemptInfo) { attempts.Add(1) }})
		_, _, err = do(t, tr, http.MethodPost, url, "{}", nil)
		var e *idemclient.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, 3, e.Attempts)
		require.NotEmpty(t, e.Key)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.EqualValues(t, 3, attempts.Load())
		require.Len(t, sl.Waits(), 2)
	})
}

// Regression (a fresh user's try): the default budget, 8 attempts, gave up
// after about 8 s of 409s at idem's 1 s Retry-After while a dead server's
// claim held the key for its 30 s lease; the request then failed though its
// retry a little later would have run it.
func TestDefaultsOutlastADeadOwnersLease(t *testing.T) {
	t.Parallel()
	codes := make([]int, 31, 32) // one 409 a second for the whole default lease, and one more
	for i := range codes {
		codes[i] = http.StatusConflict
	}
	ex := post(t, idemclient.Config{}, statuses(http.Header{"Retry-After": {"1"}}, append(codes, http.StatusCreated)...))
	require.Equal(t, http.StatusCreated, ex.resp.StatusCode)
	require.Len(t, ex.hits, 32)
	var waited time.Duration
	for _, w := range ex.waits {
		waited += w
	}
	require.Equal(t, 31*time.Second, waited)
	require.Less(t, waited, idemclient.DefaultMaxElapsed, "MaxElapsed allows it")
}

func TestContextCancelStopsRetries(t *testing.T) {
	t.Parallel()
	t.Run("during the wait", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 503))
		retrying := make(chan struct{})
		tr, err := idemclient.New(idemclient.Config{ // the real Sleep
			Backoff:    func(int, *http.Response) time.Duration { return time.Hour },
			MaxElapsed: 2 * time.Hour,
			OnRetry:    func(idemclient.RetryInfo) { close(retrying) },
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req := newRequest(t, ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
		done := make(chan error, 1)
		go func() {
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				err = errors.Join(err, resp.Body.Close())
			}
			done <- err
		}()
		<-retrying
		cancel()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("RoundTrip kept waiting after its context was canceled")
		}
		require.ErrorIs(t, err, context.Canceled)
		var e *idemclient.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, 1, e.Attempts)
		require.Equal(t, http.StatusServiceUnavailable, e.Status)
		require.Equal(t, srv.Hits()[0].Keys, []string{e.Key})
		require.Len(t, srv.Hits(), 1)
	})
	t.Run("during an attempt", func(t *testing.T) {
		arrived, release := make(chan struct{}), make(chan struct{})
		srv := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
			close(arrived)
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})
		t.Cleanup(func() { close(release) })
		var retries atomic.Int32
		tr, sl := newTransport(t, idemclient.Config{OnRetry: func(idemclient.RetryInfo) { retries.Add(1) }})
		ctx, cancel := context.WithCancel(t.Context())
		req := newRequest(t, ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
		go func() { <-arrived; cancel() }()
		_, err := tr.RoundTrip(req)
		require.ErrorIs(t, err, context.Canceled)
		require.Len(t, srv.Hits(), 1)
		require.Zero(t, retries.Load())
		require.Empty(t, sl.Waits())
	})
	t.Run("already canceled", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 201))
		tr, _ := newTransport(t, idemclient.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := tr.RoundTrip(newRequest(t, ctx, http.MethodPost, srv.URL, strings.NewReader("{}")))
		require.ErrorIs(t, err, context.Canceled)
		require.Empty(t, srv.Hits())
	})
}

func TestBodyRewoundOnEveryAttempt(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat(`{"amount":1000,"currency":"JPY"}`, 3000) // ~96 KiB
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"strings.Reader (GetBody)", func() io.Reader { return strings.NewReader(payload) }},
		{"opaque reader (buffered)", func() io.Reader { return hiddenReader{strings.NewReader(payload)} }},
		{"opaque one-byte reader (buffered)", func() io.Reader { return hiddenReader{iotest.OneByteReader(strings.NewReader(payload))} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, statuses(nil, 503, 502, 201))
			tr, _ := newTransport(t, idemclient.Config{})
			resp, _ := roundTrip(t, tr, newRequest(t, t.Context(), http.MethodPost, srv.URL, tc.body()))
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 3)
			for _, h := range hits {
				require.Equal(t, payload, h.Body)
			}
		})
	}
}

func TestBodyTooLargeToBufferIsSentOnce(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat("x", 1000)
	for _, limit := range []int64{16, -1} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			srv := newServer(t, statuses(nil, 503, 201))
			tr, sl := newTransport(t, idemclient.Config{MaxBufferedBody: limit})
			resp, _ := roundTrip(t, tr, newRequest(t, t.Context(), http.MethodPost, srv.URL, hiddenReader{strings.NewReader(payload)}))
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 1)
			require.Equal(t, payload, hits[0].Body, "the whole body is streamed")
			require.Len(t, hits[0].Keys, 1, "the key is still sent")
			require.Empty(t, sl.Waits())
		})
	}
}

// closeRecorder records whether the transport closed the request body, and
// answers the Close with err.
type closeRecorder struct {
	io.Reader
	err    error
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return c.err }

func TestRequestBodyErrors(t *testing.T) {
	t.Parallel()
	t.Run("read error", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 201))
		tr, _ := newTransport(t, idemclient.Config{})
		body := &closeRecorder{Reader: iotest.ErrReader(io.ErrUnexpectedEOF)}
		_, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodPost, srv.URL, body))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.True(t, body.closed.Load())
		require.Empty(t, srv.Hits())
	})
	t.Run("read and Close errors", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 201))
		tr, _ := newTransport(t, idemclient.Config{})
		closeErr := errors.New("close failed")
		body := &closeRecorder{Reader: iotest.ErrReader(io.ErrUnexpectedEOF), err: closeErr}
		_, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodPost, srv.URL, body))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.ErrorIs(t, err, closeErr)
		require.Empty(t, srv.Hits())
	})
	t.Run("Close error after the body was buffered", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 201))
		tr, _ := newTransport(t, idemclient.Config{})
		closeErr := errors.New("close failed")
		body := &closeRecorder{Reader: strings.NewReader("{}"), err: closeErr}
		_, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodPost, srv.URL, body))
		require.ErrorIs(t, err, closeErr, "as net/http, a body whose Close fails is not sent")
		require.Empty(t, srv.Hits())
	})
	t.Run("GetBody error", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 503, 201))
		tr, _ := newTransport(t, idemclient.Config{})
		req := newRequest(t, t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}"))
		boom := errors.New("boom")
		req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
		_, err := tr.RoundTrip(req)
		require.ErrorIs(t, err, boom)
		require.Len(t, srv.Hits(), 1)
	})
	t.Run("NewKey error", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 201))
		boom := errors.New("no entropy")
		tr, _ := newTransport(t, idemclient.Config{NewKey: func() (string, error) { return "", boom }})
		body := &closeRecorder{Reader: strings.NewReader("{}")}
		_, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodPost, srv.URL, body))
		require.ErrorIs(t, err, boom)
		require.True(t, body.closed.Load())
		require.Empty(t, srv.Hits())
	})
}

func TestDroppedConnectionIsRetried(t *testing.T) {
	t.Parallel()
	for _, reset := range []bool{false, true} {
		t.Run(map[bool]string{false: "closed", true: "reset"}[reset], func(t *testing.T) {
			srv := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						panic(err)
					}
					if reset {
						_ = conn.(*net.TCPConn).SetLinger(0) // close with RST
					}
					if err := conn.Close(); err != nil {
						panic(err)
					}
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			var retries []idemclient.RetryInfo
			tr, sl := newTransport(t, idemclient.Config{OnRetry: func(ri idemclient.RetryInfo) { retries = append(retries, ri) }})
			resp, _, err := do(t, tr, http.MethodPost, srv.URL, `{"amount":1}`, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 2)
			require.Equal(t, hits[0].Keys, hits[1].Keys)
			require.Equal(t, hits[0].Body, hits[1].Body)
			require.Len(t, retries, 1)
			require.Error(t, retries[0].Err)
			require.Zero(t, retries[0].Status)
			require.Len(t, sl.Waits(), 1)
		})
	}
}

func TestAttemptTimeout(t *testing.T) {
	t.Parallel()
	release, bodyGate := make(chan struct{}), make(chan struct{})
	var openGate sync.Once
	srv := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // never answers: the attempt times out
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		<-bodyGate
		_, _ = io.WriteString(w, "created")
	})
	t.Cleanup(func() { close(release); openGate.Do(func() { close(bodyGate) }) })
	var retryErr error
	tr, _ := newTransport(t, idemclient.Config{
		AttemptTimeout: 50 * time.Millisecond,
		OnRetry:        func(ri idemclient.RetryInfo) { retryErr = ri.Err },
	})
	resp, err := tr.RoundTrip(newRequest(t, t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}")))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.ErrorIs(t, retryErr, idemclient.ErrAttemptTimeout)

	// The attempt timeout does not bound reading the returned body.
	time.Sleep(150 * time.Millisecond)
	openGate.Do(func() { close(bodyGate) })
	require.Equal(t, "created", readBody(t, resp))
	require.Len(t, srv.Hits(), 2)
}

func TestDiscardedResponsesReuseTheConnection(t *testing.T) {
	t.Parallel()
	var conns, hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits.Add(1) < 4 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Repeat("overloaded ", 500)) // ~5 KiB, drained
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	tr, _ := newTransport(t, idemclient.Config{Transport: inner})
	resp, _, err := do(t, tr, http.MethodPost, srv.URL, "{}", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 4, hits.Load())
	require.EqualValues(t, 1, conns.Load(), "every attempt used the one connection")
}

func TestHooks(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusConflict)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	var (
		mu       sync.Mutex
		attempts []idemclient.AttemptInfo
		retries  []idemclient.RetryInfo
	)
	tr, sl := newTransport(t, idemclient.Config{
		OnAttempt: func(ai idemclient.AttemptInfo) { mu.Lock(); attempts = append(attempts, ai); mu.Unlock() },
		OnRetry:   func(ri idemclient.RetryInfo) { mu.Lock(); retries = append(retries, ri); mu.Unlock() },
	})
	resp, _, err := do(t, tr, http.MethodPost, srv.URL, "{}", nil)
	require.NoError(t, err)
	key := idemclient.KeyFromResponse(resp)
	require.NotEmpty(t, key)

	require.Len(t, attempts, 3)
	for i, want := range []int{503, 409, 201} {
		a := attempts[i]
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, want, a.Status)
		require.Equal(t, key, a.Key)
		require.Equal(t, key, a.Request.Header.Get(idemclient.HeaderKey))
		require.NoError(t, a.Err)
		require.NotNil(t, a.Response)
		require.GreaterOrEqual(t, a.Duration, time.Duration(0))
	}
	require.Len(t, retries, 2)
	require.Equal(t, 1, retries[0].Attempt)
	require.Equal(t, 503, retries[0].Status)
	require.Equal(t, time.Second, retries[0].Wait)
	require.Equal(t, 2, retries[1].Attempt)
	require.Equal(t, 409, retries[1].Status)
	require.Equal(t, 2*time.Second, retries[1].Wait)
	require.Equal(t, key, retries[1].Key)
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second}, sl.Waits(), "the waits announced are the waits taken")
}

func TestCheckRetryAndBackoffReplaceable(t *testing.T) {
	t.Parallel()
	t.Run("retry a 500", func(t *testing.T) {
		ex := post(t, idemclient.Config{
			CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
				if err == nil && resp.StatusCode == http.StatusInternalServerError {
					return true, nil
				}
				return idemclient.DefaultCheckRetry(ctx, resp, err)
			},
			Backoff: func(attempt int, _ *http.Response) time.Duration {
				return time.Duration(attempt) * 7 * time.Millisecond
			},
		}, statuses(nil, 500, 201))
		require.Equal(t, http.StatusCreated, ex.resp.StatusCode)
		require.Equal(t, []time.Duration{7 * time.Millisecond}, ex.waits)
	})
	t.Run("CheckRetry error", func(t *testing.T) {
		srv := newServer(t, statuses(nil, 503, 201))
		stop := errors.New("circuit open")
		tr, _ := newTransport(t, idemclient.Config{
			CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return false, stop },
		})
		_, _, err := do(t, tr, http.MethodPost, srv.URL, "{}", nil)
		require.ErrorIs(t, err, stop)
		var e *idemclient.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, http.StatusServiceUnavailable, e.Status)
		require.Len(t, srv.Hits(), 1)
	})
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	e := &idemclient.Error{Key: "k-1", Attempts: 3, Status: 503, Err: context.Canceled}
	require.Equal(t, `idemclient: 3 attempts, Idempotency-Key "k-1", last status 503: context canceled`, e.Error())
	e = &idemclient.Error{Attempts: 1, Err: io.EOF}
	require.Equal(t, `idemclient: 1 attempt: EOF`, e.Error())
}

func TestKeyFromResponseAndReplayed(t *testing.T) {
	t.Parallel()
	require.Empty(t, idemclient.KeyFromResponse(nil))
	require.Empty(t, idemclient.KeyFromResponse(&http.Response{}))
	require.False(t, idemclient.Replayed(nil))
	require.True(t, idemclient.Replayed(&http.Response{Header: http.Header{"Idempotent-Replayed": {"true"}}}))
	require.False(t, idemclient.Replayed(&http.Response{Header: http.Header{}}))
}

// Regression: DefaultKeyMethods and DefaultRetryMethods were package
// variables that every Config shared: one Config's edit changed all others.
func TestDefaultListsAreCopies(t *testing.T) {
	t.Parallel()
	a, b := idemclient.Config{}.WithDefaults(), idemclient.Config{}.WithDefaults()
	a.KeyMethods[0], a.RetryMethods[0] = http.MethodPut, http.MethodPost
	require.Equal(t, http.MethodPost, b.KeyMethods[0])
	require.Equal(t, http.MethodGet, b.RetryMethods[0])
}

func TestConfig(t *testing.T) {
	t.Parallel()
	c := idemclient.Config{}.WithDefaults()
	require.Equal(t, http.DefaultTransport, c.Transport)
	require.Equal(t, idemclient.DefaultKeyMethods(), c.KeyMethods)
	require.Equal(t, idemclient.DefaultRetryMethods(), c.RetryMethods)
	require.Equal(t, 60, c.MaxAttempts)
	require.Equal(t, 100*time.Millisecond, c.BaseDelay)
	require.Equal(t, 10*time.Second, c.MaxDelay)
	require.Equal(t, 5*time.Second, c.MaxRetryAfter)
	require.Equal(t, 60*time.Second, c.MaxElapsed)
	require.Zero(t, c.AttemptTimeout)
	require.EqualValues(t, 10<<20, c.MaxBufferedBody)
	require.EqualValues(t, 64<<10, c.MaxDrainBytes)
	require.NotNil(t, c.NewKey)
	require.NotNil(t, c.CheckRetry)
	require.NotNil(t, c.Backoff)
	require.NotNil(t, c.Sleep)
	require.Empty(t, idemclient.Config{RetryMethods: []string{}}.WithDefaults().RetryMethods)

	_, err := idemclient.New(idemclient.Config{
		MaxAttempts: -1, BaseDelay: -time.Second, MaxElapsed: -1, AttemptTimeout: -1,
		MaxRetryAfter: -1, MaxBufferedBody: -2, MaxDrainBytes: -3, KeyMethods: []string{"BAD METHOD"},
	})
	require.Error(t, err)
	for _, field := range []string{"MaxAttempts", "BaseDelay", "MaxElapsed", "AttemptTimeout", "MaxRetryAfter", "MaxBufferedBody", "MaxDrainBytes", `"BAD METHOD"`} {
		require.ErrorContains(t, err, field)
	}
	_, err = idemclient.New(idemclient.Config{BaseDelay: time.Second, MaxDelay: time.Millisecond})
	require.ErrorContains(t, err, "MaxDelay 1ms is below BaseDelay 1s")
}
