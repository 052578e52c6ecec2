package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrAttemptTimeout is wrapped by the error of an attempt that outlived
// Config.AttemptTimeout before its response headers arrived.
// DefaultCheckRetry retries it like any network error.
var ErrAttemptTimeout = errors.New("idemclient: attempt timed out")

// CheckRetry decides, after an attempt, whether to retry the request. ctx is
// the caller's request context; resp is the attempt's response (nil when err
// is set); err is the attempt's error. It must not read or close resp.Body.
//
// (true, _): retry, when the attempts, the time budget and the request body
// allow it (the error is ignored). (false, nil): stop and return what the
// attempt returned, its response or its error. (false, err): stop, close the
// response, and return err (wrapped in *Error, joined with the attempt's
// error).
type CheckRetry func(ctx context.Context, resp *http.Response, err error) (bool, error)

// DefaultCheckRetry is the default Config.CheckRetry.
//
// It stops with ctx's error once ctx has ended. It retries every network
// error (connection refused or reset, EOF before the response, a timed-out
// attempt) except those that no retry can fix: TLS certificate verification
// failures, and requests the transport refuses to send (unsupported scheme,
// no host, invalid method or header field). It retries the statuses that ask
// to come back later: 409 Conflict (idem's request-in-flight, and
// draft-ietf-httpapi-idempotency-key-header section 2.7: a concurrent
// request with the same key), 429 Too Many Requests (RFC 6585 section 4),
// 502 Bad Gateway, 503 Service Unavailable and 504 Gateway Timeout (RFC 9110
// sections 15.6.3 to 15.6.5). Every other status is final: 400, 401, 403,
// 404 and 422 (idem's key-reused) above all, and 500, whose outcome the
// server alone can judge.
//
// idem's 409 outcome-unknown (docs/problems.md) is final: the request's
// outcome cannot be known and retrying does not help, so it stops there;
// to tell it, DefaultCheckRetry reads a 409's problem document with
// ProblemOf, which gives the body back unread.
//
// A 409 that is a business conflict rather than a request in flight is
// retried as well, up to the bounds, and then returned unchanged; replace
// CheckRetry where an API uses 409 that way.
func DefaultCheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return !permanent(err), nil
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		return !outcomeUnknown(resp), nil
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, nil
	}
	return false, nil
}

// outcomeUnknown reports whether resp is idem's 409 outcome-unknown
// (docs/problems.md): its problem's type names that kind. ProblemOf gives
// the body back unread.
func outcomeUnknown(resp *http.Response) bool {
	p, ok, _ := ProblemOf(resp)
	return ok && strings.HasSuffix(p.Type, "#outcome-unknown")
}

// permanentMessages are the errors net/http returns, unexported, for a
// request it refuses to send: sending it again fails again.
var permanentMessages = []string{
	"unsupported protocol scheme",
	"no Host in request URL",
	"net/http: invalid method",
	"net/http: invalid header field",
	"net/http: nil Request.URL",
	"net/http: nil Request.Header",
}

// permanent reports whether err is one no retry can fix.
func permanent(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return true
	}
	if errors.Is(err, ErrAttemptTimeout) {
		return false
	}
	msg := err.Error()
	for _, m := range permanentMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// Backoff returns the wait before the retry that follows attempt number
// attempt (1 after the first attempt), given that attempt's response (nil
// after a network error; its body must not be read). A negative wait counts
// as 0. Whatever it returns, the Transport makes no retry whose wait would
// end past Config.MaxElapsed or the request context's deadline.
type Backoff func(attempt int, resp *http.Response) time.Duration

// defaultBackoff is FullJitter on the default settings.
var defaultBackoff = FullJitter(DefaultBaseDelay, DefaultMaxDelay, DefaultMaxRetryAfter, nil)

// DefaultBackoff is FullJitter(DefaultBaseDelay, DefaultMaxDelay,
// DefaultMaxRetryAfter, nil): a Retry-After of the response, capped at 5 s,
// or else a wait drawn from [0, min(10 s, 100 ms·2^(attempt-1))).
func DefaultBackoff(attempt int, resp *http.Response) time.Duration {
	return defaultBackoff(attempt, resp)
}

// FullJitter returns the "full jitter" exponential backoff of the AWS
// Architecture Blog's "Exponential Backoff and Jitter" (Marc Brooker, 2015):
// the wait before the retry that follows attempt n is drawn uniformly from
// [0, min(maxDelay, base·2^(n-1))), so base before the first retry, then
// 2·base, 4·base, ... up to maxDelay. Spreading the whole window keeps
// clients that failed together from retrying together.
//
// When the response carries a positive Retry-After (ParseRetryAfter, RFC
// 9110 section 10.2.3), that wait is used instead, capped at maxRetryAfter;
// maxRetryAfter <= 0 ignores Retry-After. A Retry-After of 0 or a past date
// falls back to the jittered wait.
//
// rnd is the random source, for reproducible tests; it is guarded by a
// mutex, so the Backoff is safe for concurrent use. nil uses math/rand/v2's
// global source. base and maxDelay should be positive, maxDelay >= base.
func FullJitter(base, maxDelay, maxRetryAfter time.Duration, rnd *rand.Rand) Backoff {
	draw := rand.Int64N
	if rnd != nil {
		var mu sync.Mutex
		draw = func(n int64) int64 {
			mu.Lock()
			defer mu.Unlock()
			return rnd.Int64N(n)
		}
	}
	return func(attempt int, resp *http.Response) time.Duration {
		if resp != nil && maxRetryAfter > 0 {
			if d, ok := ParseRetryAfter(resp.Header, time.Now()); ok && d > 0 {
				return min(d, maxRetryAfter)
			}
		}
		w := backoffWindow(base, maxDelay, attempt)
		if w <= 0 {
			return 0
		}
		return time.Duration(draw(int64(w)))
	}
}

// backoffWindow is min(maxDelay, base·2^(attempt-1)), without overflow.
func backoffWindow(base, maxDelay time.Duration, attempt int) time.Duration {
	n := max(attempt-1, 0)
	if base <= 0 {
		return 0
	}
	if n >= 62 || base > maxDelay>>n {
		return maxDelay
	}
	return min(base<<n, maxDelay)
}

// ParseRetryAfter reads the Retry-After field of h (RFC 9110 section
// 10.2.3): either delay-seconds (1*DIGIT) or an HTTP-date (RFC 9110 section
// 5.6.7, in any of its three formats), which is turned into the time left
// after now (0 for a date in the past). It reports false when the field is
// absent or malformed (a negative or fractional number, an unknown date
// format). delay-seconds too large for a time.Duration give the largest
// time.Duration. Only the first field line is read.
func ParseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if digits(v) {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil || s > int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(s) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
