package idemclient_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemclient"
)

func TestFullJitterStaysInItsWindow(t *testing.T) {
	t.Parallel()
	const base, maxDelay = 100 * time.Millisecond, 10 * time.Second
	backoff := idemclient.FullJitter(base, maxDelay, 30*time.Second, rand.New(rand.NewPCG(1, 2)))
	const samples = 5000
	for attempt := 1; attempt <= 12; attempt++ {
		window := min(maxDelay, base*time.Duration(1<<(attempt-1)))
		lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
		for range samples {
			d := backoff(attempt, nil)
			require.GreaterOrEqual(t, d, time.Duration(0), "attempt %d", attempt)
			require.Less(t, d, window, "attempt %d", attempt)
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole window, not around its top.
		require.Less(t, lo, window/20, "attempt %d", attempt)
		require.Greater(t, hi, window-window/20, "attempt %d", attempt)
	}
	for _, attempt := range []int{0, -3} { // below 1 counts as the first
		require.Less(t, backoff(attempt, nil), base)
	}
	for _, attempt := range []int{40, 63, 64, 1000, math.MaxInt} { // no overflow past the cap
		d := backoff(attempt, nil)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, maxDelay)
	}
}

func TestFullJitterIsReproducible(t *testing.T) {
	t.Parallel()
	a := idemclient.FullJitter(time.Millisecond, time.Second, 0, rand.New(rand.NewPCG(7, 7)))
	b := idemclient.FullJitter(time.Millisecond, time.Second, 0, rand.New(rand.NewPCG(7, 7)))
	for attempt := 1; attempt < 20; attempt++ {
		require.Equal(t, a(attempt, nil), b(attempt, nil))
	}
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for attempt := 1; attempt <= 10; attempt++ {
		window := min(idemclient.DefaultMaxDelay, idemclient.DefaultBaseDelay<<(attempt-1))
		for range 200 {
			d := idemclient.DefaultBackoff(attempt, nil)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, window)
		}
	}
	resp := &http.Response{Header: http.Header{"Retry-After": {"4"}}}
	require.Equal(t, 4*time.Second, idemclient.DefaultBackoff(1, resp))
	resp.Header.Set("Retry-After", "86400")
	require.Equal(t, idemclient.DefaultMaxRetryAfter, idemclient.DefaultBackoff(1, resp))
}

func TestFullJitterRetryAfter(t *testing.T) {
	t.Parallel()
	resp := &http.Response{Header: http.Header{"Retry-After": {"3"}}}
	require.Equal(t, 3*time.Second, idemclient.FullJitter(time.Millisecond, time.Second, time.Minute, nil)(5, resp))
	require.Equal(t, 2*time.Second, idemclient.FullJitter(time.Millisecond, time.Second, 2*time.Second, nil)(5, resp))
	// maxRetryAfter <= 0 ignores Retry-After.
	require.Less(t, idemclient.FullJitter(time.Millisecond, time.Millisecond, 0, nil)(5, resp), time.Millisecond)
	// Malformed or zero: the jittered wait.
	for _, v := range []string{"0", "soon", "-1"} {
		resp.Header.Set("Retry-After", v)
		require.Less(t, idemclient.FullJitter(time.Millisecond, time.Millisecond, time.Minute, nil)(1, resp), time.Millisecond, v)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"5", 5 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"+1", 0, false},
		{"1.5", 0, false},
		{"1e3", 0, false},
		{"soon", 0, false},
		{"99999999999999999999", time.Duration(math.MaxInt64), true},
		{"9223372037", time.Duration(math.MaxInt64), true}, // just past the largest Duration in seconds
		// The three HTTP-date formats of RFC 9110 section 5.6.7.
		{"Mon, 30 Nov 2026 09:01:30 GMT", 90 * time.Second, true},  // IMF-fixdate
		{"Monday, 30-Nov-26 09:00:10 GMT", 10 * time.Second, true}, // obsolete RFC 850
		{"Mon Nov 30 09:00:03 2026", 3 * time.Second, true},        // asctime
		{"Mon, 30 Nov 2026 08:59:00 GMT", 0, true},                 // in the past
		{"Mon, 30 Nov 2026 09:01:30 +0000", 0, false},              // not an HTTP-date
		{"2026-11-30T09:01:30Z", 0, false},                         // nor is RFC 3339
	} {
		t.Run(fmt.Sprintf("%q", tc.value), func(t *testing.T) {
			h := http.Header{}
			if tc.value != "" {
				h.Set("Retry-After", tc.value)
			}
			got, ok := idemclient.ParseRetryAfter(h, now)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestDefaultCheckRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for code := 100; code < 600; code++ {
		retry, err := idemclient.DefaultCheckRetry(ctx, &http.Response{StatusCode: code}, nil)
		require.NoError(t, err)
		want := code == 409 || code == 429 || code == 502 || code == 503 || code == 504
		require.Equal(t, want, retry, "status %d", code)
	}
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("read: %w", errors.New("connection reset by peer")), true},
		{fmt.Errorf("%w after 1s", idemclient.ErrAttemptTimeout), true},
		{x509.UnknownAuthorityError{}, false},
		{x509.HostnameError{Host: "example.com"}, false},
		{errors.New(`unsupported protocol scheme "ftp"`), false},
		{errors.New(`net/http: invalid header field value for "X"`), false},
	} {
		retry, err := idemclient.DefaultCheckRetry(ctx, nil, tc.err)
		require.NoError(t, err)
		require.Equal(t, tc.retry, retry, "%v", tc.err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	retry, err := idemclient.DefaultCheckRetry(canceled, &http.Response{StatusCode: 503}, nil)
	require.False(t, retry)
	require.ErrorIs(t, err, context.Canceled)
}

// idem's 409 outcome-unknown stops the retries; its body is still there to
// read. The in-flight 409 is retried.
func TestDefaultCheckRetryStopsOnOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for kind, want := range map[string]bool{"outcome-unknown": false, "request-in-flight": true} {
		body := `{"type":"https://github.com/idemgo/idem/blob/main/docs/problems.md#` + kind + `","status":409,"new_key_safe":false}`
		resp := &http.Response{StatusCode: 409, Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body: io.NopCloser(strings.NewReader(body))}
		retry, err := idemclient.DefaultCheckRetry(context.Background(), resp, nil)
		require.NoError(t, err)
		require.Equal(t, want, retry, kind)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, body, string(got), "%s: the body is given back unread", kind)
	}
}
