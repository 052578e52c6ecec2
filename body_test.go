package idem_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// readCounter is a request body that counts the bytes read from it.
type readCounter struct {
	r    io.Reader
	read atomic.Int64
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// What idem reads of a body over MaxRequestBytes before its 413, and
// whether the answer closes the connection: the rest of a body that ends
// within MaxRequestBytes + DiscardBytes is read and dropped, the
// connection kept; a longer one, or one whose client waits for "100
// Continue", is left unread and the connection closed; HTTP/2 reads nothing
// and closes nothing (the stream ends). The recorder has no read deadline:
// the bytes bound alone.
func TestTooLargeReadsWithinTheBound(t *testing.T) {
	t.Parallel()
	const limit, discard = 1 << 10, 4 << 10
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, nil, idem.Options{Request: idem.RequestOptions{MaxBytes: limit, Drain: idem.DrainOptions{Bytes: discard}}}).Handler(c)
	for _, tc := range []struct {
		name     string
		size     int64 // the body's
		declared bool
		mutate   func(*http.Request)
		read     int64
		closes   bool
	}{
		{name: "declared, one byte over", size: limit + 1, declared: true, read: limit + 1},
		{name: "declared, to the bound", size: limit + discard, declared: true, read: limit + discard},
		{name: "declared, past the bound", size: limit + discard + 1, declared: true, read: 0, closes: true},
		{name: "declared, Expect: 100-continue", size: limit + 1, declared: true, read: 0, closes: true,
			mutate: func(r *http.Request) { r.Header.Set("Expect", "100-Continue") }},
		{name: "declared, HTTP/2", size: limit + 1, declared: true, read: 0,
			mutate: func(r *http.Request) { r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0 }},
		{name: "chunked, one byte over", size: limit + 1, read: limit + 1},
		{name: "chunked, to the bound", size: limit + discard, read: limit + discard},
		{name: "chunked, past the bound", size: 16 << 10, read: limit + discard + 1, closes: true},
		{name: "chunked, HTTP/2", size: 16 << 10, read: limit + 1,
			mutate: func(r *http.Request) { r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0 }},
	} {
		body := &readCounter{r: bytes.NewReader(bytes.Repeat([]byte("1"), int(tc.size)))}
		got := send(h, "POST", "/x", "k", "", func(r *http.Request) {
			r.Body, r.ContentLength = io.NopCloser(body), -1
			if tc.declared {
				r.ContentLength = tc.size
			}
			if tc.mutate != nil {
				tc.mutate(r)
			}
		})
		requireKind(t, got, http.StatusRequestEntityTooLarge, "request-too-large")
		require.Equal(t, tc.read, body.read.Load(), tc.name)
		if tc.closes {
			require.Equal(t, "close", got.Header().Get("Connection"), tc.name)
		} else {
			require.Empty(t, got.Header().Get("Connection"), tc.name)
		}
	}
	require.Zero(t, c.runs)
}

// tooLargeServer serves a counter behind idem with cfg on an HTTP/1.1
// server (HTTP/2 over TLS with h2), the body wrapped first as
// instrumentation (otelhttp) wraps it when wrapped is set; conns counts
// the connections it accepted.
func tooLargeServer(t *testing.T, cfg idem.Options, wrapped, h2 bool) (srv *httptest.Server, c *counter, conns *atomic.Int32) {
	t.Helper()
	c, conns = &counter{status: http.StatusCreated}, &atomic.Int32{}
	h := newMiddleware(t, nil, cfg).Handler(c)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wrapped {
			r.Body = struct{ io.ReadCloser }{r.Body}
		}
		h.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, c, conns
}

// postTooLarge POSTs size bytes of body to srv with client, declared or
// chunked (a reader of unknown length), and returns the answer's status
// and whether it closes the connection.
func postTooLarge(client *http.Client, url string, size int, declared bool) (int, bool, error) {
	var body io.Reader = bytes.NewReader(bytes.Repeat([]byte("1"), size))
	if !declared {
		body = io.MultiReader(body) // no length: sent chunked
	}
	req, err := http.NewRequest(http.MethodPost, url+"/x", body)
	if err != nil {
		return 0, false, err
	}
	req.Header.Set(idem.HeaderKey, "k")
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return resp.StatusCode, resp.Close, err
}

// Regression (a new user's try, issue 32): a Go client POSTing one byte
// over MaxRequestBytes saw "connection reset by peer" instead of 413 in 1
// of 4 runs: the body was refused unread, and the connection closed while
// the client still sent it. Behind instrumentation that wraps the body (as
// otelhttp does, and paymentsd with spans), it was worse: idem closed the
// body early, net/http could no longer tell, kept the connection, and read
// the body's rest as the next request (its "method" the body's bytes, not
// protected), so the client's next request got that one's answer: a 201
// from the handler. Now the rest is read and dropped (within DiscardBytes)
// before the 413: every run gets its 413 on one connection, kept
// throughout, declared or chunked, the body wrapped or not.
func TestTooLargeAnsweredToGoClient(t *testing.T) {
	t.Parallel()
	for _, wrapped := range []bool{false, true} {
		for _, declared := range []bool{true, false} {
			for _, size := range []int{idem.DefaultMaxRequestBytes + 1, idem.DefaultMaxRequestBytes + 300<<10} {
				name := fmt.Sprintf("wrapped=%t/declared=%t/%d", wrapped, declared, size)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					srv, c, conns := tooLargeServer(t, idem.Options{}, wrapped, false)
					for i := range 20 {
						status, closes, err := postTooLarge(srv.Client(), srv.URL, size, declared)
						require.NoError(t, err, "run %d", i)
						require.Equal(t, http.StatusRequestEntityTooLarge, status, "run %d", i)
						require.False(t, closes, "run %d: the body was read, the connection is kept", i)
					}
					require.EqualValues(t, 1, conns.Load(), "one connection, never reset nor closed")
					require.Zero(t, c.runs)
				})
			}
		}
	}
}

// A Go client that sends "Expect: 100-continue" gets the 413 instead of
// "100 Continue", and sends none of its body; the connection closes after
// the answer (RFC 9112 section 9.6).
func TestTooLargeAnsweredBeforeContinue(t *testing.T) {
	t.Parallel()
	srv, c, conns := tooLargeServer(t, idem.Options{}, false, false)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = time.Hour // the client sends the body only when told to
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	for i := range 20 {
		body := &readCounter{r: bytes.NewReader(bytes.Repeat([]byte("1"), idem.DefaultMaxRequestBytes+1))}
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/x", body)
		require.NoError(t, err)
		req.ContentLength = idem.DefaultMaxRequestBytes + 1
		req.Header.Set("Expect", "100-continue")
		req.Header.Set(idem.HeaderKey, "k")
		resp, err := client.Do(req)
		require.NoError(t, err, "run %d", i)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "run %d", i)
		require.True(t, resp.Close, "run %d: Connection: close", i)
		require.Zero(t, body.read.Load(), "run %d: the client sent no body", i)
	}
	require.EqualValues(t, 20, conns.Load())
	require.Zero(t, c.runs)
}

// rawPOST opens a connection to srv and writes a POST's head with the
// given extra header lines; the caller writes the body, if any.
func rawPOST(t *testing.T, srv *httptest.Server, contentLength int64, extra ...string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	// A bound on the test's reads: a server that never answers fails the
	// test, instead of hanging it.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Minute)))
	head := fmt.Sprintf("POST /x HTTP/1.1\r\nHost: idem\r\n%s: k\r\nContent-Length: %d\r\n", idem.HeaderKey, contentLength)
	for _, line := range extra {
		head += line + "\r\n"
	}
	_, err = io.WriteString(conn, head+"\r\n")
	require.NoError(t, err)
	return conn, bufio.NewReader(conn)
}

// requireClosed reads what is left of conn's answers: nothing, the
// connection closed (or reset, past the unread body).
func requireClosed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	n, err := io.Copy(io.Discard, br)
	require.Zero(t, n, "no other answer")
	if err != nil { // a reset: what the client sent after the answer was not read
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server closed the connection")
	}
}

// readTooLarge reads an answer from br, requires a 413, and reports whether
// it closes the connection.
func readTooLarge(t *testing.T, br *bufio.Reader) bool {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "the 413 (not 100 Continue)")
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	return resp.Close
}

// Over the wire: a client waiting for "100 Continue" gets the 413 first
// (no "100 Continue" before it), with Connection: close; a body it sends
// anyway is not read, and the connection closes (RFC 9112 section 9.6).
func TestTooLargeExpectContinueOnTheWire(t *testing.T) {
	t.Parallel()
	srv, c, _ := tooLargeServer(t, idem.Options{Request: idem.RequestOptions{MaxBytes: 1 << 10}}, false, false)
	conn, br := rawPOST(t, srv, 1<<10+1, "Expect: 100-continue")
	require.True(t, readTooLarge(t, br), "Connection: close")
	_, _ = conn.Write(bytes.Repeat([]byte("1"), 1<<10+1)) // sent anyway: ignored
	requireClosed(t, br)
	require.Zero(t, c.runs)
}

// Over the wire: a body declared past MaxRequestBytes + DiscardBytes is
// answered at once, unread, and the connection closed; one whose client
// stops sending within the bound is answered once DiscardTimeout has
// passed (the read deadline), and the connection closed.
func TestTooLargeBoundsOnTheWire(t *testing.T) {
	t.Parallel()
	const limit, discard = 1 << 10, 4 << 10
	srv, _, _ := tooLargeServer(t, idem.Options{Request: idem.RequestOptions{MaxBytes: limit, Drain: idem.DrainOptions{Bytes: discard, Timeout: 100 * time.Millisecond}}}, false, false)
	t.Run("past the bytes", func(t *testing.T) {
		t.Parallel()
		_, br := rawPOST(t, srv, limit+discard+1) // no body sent: answered unread
		require.True(t, readTooLarge(t, br), "Connection: close")
		requireClosed(t, br)
	})
	t.Run("past the time", func(t *testing.T) {
		t.Parallel()
		conn, br := rawPOST(t, srv, limit+10)
		_, err := conn.Write(bytes.Repeat([]byte("1"), limit+5)) // and then nothing
		require.NoError(t, err)
		require.True(t, readTooLarge(t, br), "answered once the read deadline passed, Connection: close")
		requireClosed(t, br)
	})
	t.Run("read to its end", func(t *testing.T) {
		t.Parallel()
		conn, br := rawPOST(t, srv, limit+10)
		_, err := conn.Write(bytes.Repeat([]byte("1"), limit+10))
		require.NoError(t, err)
		require.False(t, readTooLarge(t, br), "kept: the body was read")
		// The connection serves the next request.
		_, err = fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: idem\r\n%s: k\r\nContent-Length: 2\r\n\r\n{}", idem.HeaderKey)
		require.NoError(t, err)
		next, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, next.StatusCode, "the handler ran, once")
	})
}

// HTTP/2: the 413 ends the request's stream; nothing is read or closed,
// and the connection serves the next requests.
func TestTooLargeOverHTTP2(t *testing.T) {
	t.Parallel()
	srv, c, conns := tooLargeServer(t, idem.Options{}, false, true)
	client := srv.Client()
	for i := range 10 {
		for _, declared := range []bool{true, false} {
			status, closes, err := postTooLarge(client, srv.URL, idem.DefaultMaxRequestBytes+300<<10, declared)
			require.NoError(t, err, "run %d", i)
			require.Equal(t, http.StatusRequestEntityTooLarge, status, "run %d", i)
			require.False(t, closes)
		}
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/x", strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set(idem.HeaderKey, "k2")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "HTTP/2.0", resp.Proto)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 1, conns.Load(), "one connection for every stream")
	srv.Close() // its handlers have returned: their count is read safely
	require.Equal(t, 1, c.runs)
}

// curl, which adds "Expect: 100-continue" by itself to a large body:
// with it, without it (-H 'Expect:'), and chunked, many runs, every one
// gets its 413 (curl exits 55 or 56 on a reset connection).
func TestTooLargeAnsweredToCurl(t *testing.T) {
	t.Parallel()
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("curl is needed under CI: %v", err)
		}
		t.Skip("no curl")
	}
	srv, c, _ := tooLargeServer(t, idem.Options{}, false, false)
	file := filepath.Join(t.TempDir(), "body")
	require.NoError(t, os.WriteFile(file, bytes.Repeat([]byte("1"), idem.DefaultMaxRequestBytes+1), 0o600))
	for name, args := range map[string][]string{
		"curl's own Expect": nil,
		"Expect":            {"-H", "Expect: 100-continue"},
		"no Expect":         {"-H", "Expect:"},
		"chunked":           {"-H", "Expect:", "-H", "Transfer-Encoding: chunked"},
	} {
		for i := range 10 {
			cmd := exec.Command(curl, append([]string{"-sS", "-o", os.DevNull, "-w", "%{http_code}", "--max-time", "60",
				"-H", idem.HeaderKey + ": k", "-H", "Content-Type: application/json", "--data-binary", "@" + file}, append(args, srv.URL+"/x")...)...)
			out, err := cmd.Output()
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			require.NoError(t, err, "%s, run %d: %s", name, i, stderr)
			require.Equal(t, "413", string(out), "%s, run %d", name, i)
		}
	}
	require.Zero(t, c.runs)
}
