package idemclient_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemclient"
)

// hit is one request as the test server saw it.
type hit struct {
	Method string
	Keys   []string // the Idempotency-Key field values; none when absent
	Body   string
}

// server is a loopback HTTP server that records every request and answers
// through respond (n is the 1-based number of the request).
type server struct {
	*httptest.Server
	mu   sync.Mutex
	hits []hit
}

func newServer(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.hits = append(s.hits, hit{Method: r.Method, Keys: r.Header.Values(idemclient.HeaderKey), Body: string(body)})
		n := len(s.hits)
		s.mu.Unlock()
		respond(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) Hits() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// statuses answers the n-th request with codes[n-1] (the last code for the
// requests after), a body naming the status, and the given headers on
// every answer but the last code's.
func statuses(retryHeader http.Header, codes ...int) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		code := codes[min(n, len(codes))-1]
		if n < len(codes) {
			for k, v := range retryHeader {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, http.StatusText(code))
	}
}

// sleeper records the waits asked of Config.Sleep without waiting.
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleeper) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeper) Waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

// newTransport builds a Transport with cfg, recording its waits unless cfg
// sets Sleep.
func newTransport(t *testing.T, cfg idemclient.Config) (*idemclient.Transport, *sleeper) {
	t.Helper()
	sl := &sleeper{}
	if cfg.Sleep == nil {
		cfg.Sleep = sl.Sleep
	}
	tr, err := idemclient.New(cfg)
	require.NoError(t, err)
	t.Cleanup(tr.CloseIdleConnections)
	return tr, sl
}

// newRequest returns a request of method to url with body, under ctx.
func newRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	require.NoError(t, err)
	return req
}

// do sends method to url with body (none when empty) and header through tr
// in an http.Client, and returns the response with its body read and
// closed, or the client's error.
func do(t *testing.T, tr http.RoundTripper, method, url, body string, header http.Header) (*http.Response, string, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := newRequest(t, t.Context(), method, url, rd)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, "", err
	}
	return resp, readBody(t, resp), nil
}

// roundTrip sends req through tr.RoundTrip (no http.Client: a redirect is
// not followed), requires an answer, and returns it with its body read and
// closed.
func roundTrip(t *testing.T, tr http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	return resp, readBody(t, resp)
}

// readBody reads resp's body to its end and closes it.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

// exchange is one POST sent through a Transport to a server of its own: the
// answer the caller got, with its body, and what the server and the
// Transport's Sleep saw.
type exchange struct {
	resp  *http.Response
	body  string
	hits  []hit
	waits []time.Duration
}

// post serves respond on a new server, sends one POST of body {} to it
// through a new Transport with cfg (its waits recorded unless cfg sets
// Sleep) and an http.Client, requires an answer, and returns the exchange.
func post(t *testing.T, cfg idemclient.Config, respond func(n int, w http.ResponseWriter, r *http.Request)) exchange {
	t.Helper()
	srv := newServer(t, respond)
	tr, sl := newTransport(t, cfg)
	resp, body, err := do(t, tr, http.MethodPost, srv.URL, "{}", nil)
	require.NoError(t, err)
	return exchange{resp: resp, body: body, hits: srv.Hits(), waits: sl.Waits()}
}

// hiddenReader hides the type of its reader from http.NewRequest, so the
// request gets no GetBody.
type hiddenReader struct{ io.Reader }
