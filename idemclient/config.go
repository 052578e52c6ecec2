package idemclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxAttempts     = 60
	DefaultBaseDelay       = 100 * time.Millisecond
	DefaultMaxDelay        = 10 * time.Second
	DefaultMaxRetryAfter   = 5 * time.Second
	DefaultMaxElapsed      = 60 * time.Second
	DefaultMaxBufferedBody = 10 << 20 // 10 MiB
	DefaultMaxDrainBytes   = 64 << 10 // 64 KiB
)

// DefaultKeyMethods returns the methods that get an Idempotency-Key when
// Config.KeyMethods is empty: the two methods RFC 9110 (section 9.2.2) does
// not define as idempotent and that the draft names (section 1), matching
// the methods idem protects by default (idem.DefaultMethods). Each call
// returns a new slice, so no Config shares it with another.
func DefaultKeyMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// DefaultRetryMethods returns the methods retried without a key when
// Config.RetryMethods is nil: the idempotent methods of RFC 9110 section
// 9.2.2 (GET, HEAD, PUT, DELETE, OPTIONS; TRACE is left out, it has no use
// behind a retrying client). Each call returns a new slice.
func DefaultRetryMethods() []string {
	return []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions}
}

// Config configures a Transport. The zero value of every field means its
// documented default; a Config is read once, by New.
type Config struct {
	// Transport sends each attempt. Default: http.DefaultTransport.
	Transport http.RoundTripper

	// KeyMethods lists the methods that get an Idempotency-Key (when the
	// caller has not set one) and are retried with it. A request of any
	// method that already carries an Idempotency-Key is retried with that
	// key too. Default: DefaultKeyMethods (POST, PATCH).
	KeyMethods []string

	// RetryMethods lists the methods retried without a key: they must be
	// idempotent on the server (RFC 9110 section 9.2.2). A non-nil empty
	// slice retries none of them; a method in neither list is sent once,
	// untouched. Default (nil): DefaultRetryMethods (GET, HEAD, PUT, DELETE,
	// OPTIONS).
	RetryMethods []string

	// NewKey returns the Idempotency-Key field value for a request that has
	// none. It is called once per request; every retry of that request sends
	// the same value. The value is sent as is: return `"` + id + `"` for the
	// RFC 8941 sf-string form of draft-ietf-httpapi-idempotency-key-header
	// section 2.1 (idem accepts both forms). An error is returned by
	// RoundTrip, wrapped in *Error, and nothing is sent. Default: NewKey (a
	// UUIDv7, RFC 9562 section 5.7, in its 36-character text form).
	NewKey func() (string, error)

	// MaxAttempts bounds the attempts of one request, the first included; 1
	// disables retries. Default: 60, so that MaxElapsed bounds the retries
	// of 409s at idem's 1 s Retry-After: they outlast a dead owner's lease
	// (30 s by default, docs/deployment.md "Deploys and restarts").
	MaxAttempts int

	// BaseDelay is the backoff's base: the wait before retry n is drawn
	// from [0, min(MaxDelay, BaseDelay·2^(n-1))] (full jitter). Used by the
	// default Backoff only. Default: 100 ms.
	BaseDelay time.Duration

	// MaxDelay caps the backoff window ("cap" in full jitter). Used by the
	// default Backoff only. Default: 10 s.
	MaxDelay time.Duration

	// MaxRetryAfter caps the wait asked for by a Retry-After header (RFC
	// 9110 section 10.2.3); a longer Retry-After waits MaxRetryAfter. idem's
	// 409 asks for its in-flight delay (idem.Options.Engine.RetryAfter.InFlight, 1 s
	// by default), never more than what is left of the first request's
	// lease; the cap bounds what another server, or an idem configured with
	// a long in-flight delay, may ask (each 409 costs the server one indexed
	// read). Used by the default Backoff only. Default: 5 s.
	MaxRetryAfter time.Duration

	// MaxElapsed bounds the time from the start of the first attempt: a
	// retry whose wait would end past it is not made, and the last response
	// (or error) is returned instead. The request context's deadline, when
	// earlier, bounds the same way. Default: 60 s.
	MaxElapsed time.Duration

	// AttemptTimeout, when positive, bounds each attempt until its response
	// headers arrive (reading the body of the returned response is bounded
	// by the request context only). An attempt that times out is retried
	// like a network error; its error wraps ErrAttemptTimeout.
	// Default: 0, no per-attempt bound.
	AttemptTimeout time.Duration

	// MaxBufferedBody bounds the bytes buffered of a request body that has
	// no GetBody (http.NewRequest sets GetBody for *bytes.Buffer,
	// *bytes.Reader and *strings.Reader bodies; other bodies cannot be
	// rewound without a copy). A body longer than this is streamed once:
	// the request gets no retry (its key is still sent). -1 never buffers,
	// so such bodies are never retried. Default: 10 MiB.
	MaxBufferedBody int64

	// MaxDrainBytes bounds the bytes read from the body of a response that
	// is discarded before a retry, so its connection can be reused; a longer
	// body is closed unread and its connection dropped. -1 never drains.
	// Default: 64 KiB.
	MaxDrainBytes int64

	// CheckRetry decides, after each attempt, whether to retry. Default:
	// DefaultCheckRetry.
	CheckRetry CheckRetry

	// Backoff returns the wait before each retry. Default: FullJitter with
	// BaseDelay, MaxDelay and MaxRetryAfter, on the global random source
	// (equal to DefaultBackoff when those three keep their defaults).
	Backoff Backoff

	// Sleep waits d, or until ctx ends, and then returns ctx's error (nil
	// when d passed). Tests replace it to record the waits without waiting.
	// Default: a timer raced against ctx.Done().
	Sleep func(ctx context.Context, d time.Duration) error

	// OnAttempt, when set, is called after every attempt (the last one
	// included), before the retry decision, for metrics and logs. It must
	// not read or close the response body. Default: nil.
	OnAttempt func(AttemptInfo)

	// OnRetry, when set, is called before each wait, once a retry has been
	// decided. Default: nil.
	OnRetry func(RetryInfo)
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Transport == nil {
		c.Transport = http.DefaultTransport
	}
	if len(c.KeyMethods) == 0 {
		c.KeyMethods = DefaultKeyMethods()
	}
	if c.RetryMethods == nil {
		c.RetryMethods = DefaultRetryMethods()
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BaseDelay = cmp.Or(c.BaseDelay, DefaultBaseDelay)
	c.MaxDelay = cmp.Or(c.MaxDelay, DefaultMaxDelay)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.MaxElapsed = cmp.Or(c.MaxElapsed, DefaultMaxElapsed)
	c.MaxBufferedBody = cmp.Or(c.MaxBufferedBody, DefaultMaxBufferedBody)
	c.MaxDrainBytes = cmp.Or(c.MaxDrainBytes, DefaultMaxDrainBytes)
	if c.NewKey == nil {
		c.NewKey = NewKey
	}
	if c.CheckRetry == nil {
		c.CheckRetry = DefaultCheckRetry
	}
	if c.Backoff == nil && c.BaseDelay > 0 && c.MaxDelay >= c.BaseDelay && c.MaxRetryAfter >= 0 {
		c.Backoff = FullJitter(c.BaseDelay, c.MaxDelay, c.MaxRetryAfter, nil)
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	return c
}

// validate returns one error naming every invalid field of c (after
// WithDefaults), nil when c is valid.
func (c Config) validate() error {
	var errs []error
	invalid := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	invalid(c.MaxAttempts < 1, "MaxAttempts %d is below 1", c.MaxAttempts)
	invalid(c.BaseDelay <= 0, "BaseDelay %s is not positive", c.BaseDelay)
	invalid(c.MaxDelay < c.BaseDelay, "MaxDelay %s is below BaseDelay %s", c.MaxDelay, c.BaseDelay)
	invalid(c.MaxRetryAfter < 0, "MaxRetryAfter %s is negative", c.MaxRetryAfter)
	invalid(c.MaxElapsed <= 0, "MaxElapsed %s is not positive", c.MaxElapsed)
	invalid(c.AttemptTimeout < 0, "AttemptTimeout %s is negative", c.AttemptTimeout)
	invalid(c.MaxBufferedBody < -1, "MaxBufferedBody %d is below -1", c.MaxBufferedBody)
	invalid(c.MaxDrainBytes < -1, "MaxDrainBytes %d is below -1", c.MaxDrainBytes)
	for _, m := range append(append([]string(nil), c.KeyMethods...), c.RetryMethods...) {
		invalid(!validMethod(m), "method %q is not an HTTP method token", m)
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemclient: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// validMethod reports whether m is a method token (RFC 9110 section 9.1:
// method = token).
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= 0x20 || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// sleep is the default Config.Sleep.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
