package idem

//lint:file-ignore ST1005 validation errors start with the path of the field they name (Engine.Lease.Duration, Request.MaxBytes...), as NewMiddleware joins them

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httpread"
	"github.com/idemgo/idem/internal/protocol"
	"github.com/idemgo/idem/seal"
)

// Defaults of Options (CONTRACT sections 2, 4 and 5): DefaultLeaseDuration
// of EngineOptions.Lease.Duration, DefaultRetention of EngineOptions.Retention,
// DefaultMaxRequestBytes of Options.Request.MaxBytes, DefaultMaxResponseBytes
// of EngineOptions.Response.MaxBytes, DefaultStoreRetryAfter of
// EngineOptions.RetryAfter.Store, DefaultInFlightRetryAfter of
// EngineOptions.RetryAfter.InFlight, DefaultCompleteTimeout and
// DefaultClaimTimeout of EngineOptions.Timeouts.Complete and .Claim,
// DefaultMaxExecution of EngineOptions.Lease.MaxExecution,
// DefaultOneCommitWait of EngineOptions.OneCommit.Wait, DefaultReplayCacheTTL
// of Options.Replay.Cache.TTL, DefaultDiscardBytes and DefaultDiscardTimeout
// of Options.Request.Drain.Bytes and .Timeout.
const (
	DefaultLeaseDuration      = 30 * time.Second
	DefaultRetention          = 24 * time.Hour
	DefaultMaxRequestBytes    = 1 << 20 // 1 MiB
	DefaultMaxResponseBytes   = 1 << 20 // 1 MiB
	DefaultStoreRetryAfter    = 1 * time.Second
	DefaultInFlightRetryAfter = 1 * time.Second
	DefaultCompleteTimeout    = 10 * time.Second
	DefaultClaimTimeout       = 10 * time.Second
	DefaultMaxExecution       = 10 * time.Minute
	DefaultOneCommitWait      = 2 * time.Second
	DefaultReplayCacheTTL     = 1 * time.Minute
	DefaultDiscardBytes       = 4 << 20 // 4 MiB
	DefaultDiscardTimeout     = 10 * time.Second
)

// DefaultMethods returns POST and PATCH (CONTRACT section 2), the default of
// Options.Methods, a new slice each call.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// DefaultReplayHeaders returns the replayed headers and trailers (CONTRACT
// section 5), the default of Options.Replay.Headers, a new slice each call. Set-Cookie, hop-by-hop headers, Date,
// Content-Length and the headers idem writes for each answer (the key's
// echo and expiry, Idempotent-Replayed, Preference-Applied) are never
// replayed.
func DefaultReplayHeaders() []string {
	return []string{
		"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
		"Location", "ETag", "Last-Modified", "Link", "Cache-Control",
		// RFC 9110 requires these with 405 and 401, which are replayed.
		"Allow", "WWW-Authenticate",
	}
}

// DefaultMaxWaiters is the default of EngineOptions.Waiting.MaxWaiters.
const DefaultMaxWaiters = 1000

// DefaultWaitPoll is the default of EngineOptions.Waiting.Poll; where the store
// notifies (PostgreSQL), waiters read their record ten times less often.
const DefaultWaitPoll = 100 * time.Millisecond

// Outcome is how a finished execution is recorded: its String is
// SUCCEEDED, FAILED or RELEASED.
type Outcome = protocol.Outcome

const (
	// Succeeded records SUCCEEDED with the response; later requests replay it.
	Succeeded = protocol.Succeeded
	// Failed records FAILED: the next request with the payload runs again.
	Failed = protocol.Failed
	// Released records nothing: the record is removed and the next request
	// with the key runs as new (CONTRACT section 5). Use it only before any side
	// effect. See ReleaseKey and ReleaseValidationFailures.
	Released = protocol.Released
)

// DefaultOutcome is the policy of CONTRACT section 5: 5xx, 408, 425 and 429
// are Failed; every other status is Succeeded.
func DefaultOutcome(status int) Outcome {
	switch {
	case status >= 500:
		return Failed
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return Failed
	default:
		return Succeeded
	}
}

// ReleaseValidationFailures is DefaultOutcome with 400, 415 and 422
// Released. Use it only when handlers answer these before any side effect;
// otherwise call ReleaseKey on the validation path.
func ReleaseValidationFailures(status int) Outcome {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return Released
	}
	return DefaultOutcome(status)
}

// MaxScopeLength is the longest scope, in bytes.
const MaxScopeLength = protocol.MaxScopeLength

// MaxMethodLength is the longest method, in bytes, of Options.Methods and
// DoParams.Method: what every store holds (MariaDB's column is 255 bytes).
const MaxMethodLength = 255

// MaxPathLength is the longest escaped path, in bytes, of a protected
// request; longer is answered 414 before any claim.
const MaxPathLength = 4096

// ScopeFunc names who owns a request's key: valid UTF-8 of at most
// MaxScopeLength bytes, no NUL. An error or "" answers 401 missing-scope;
// a scope breaking the rules answers 500 scope-unstorable.
type ScopeFunc func(r *http.Request) (string, error)

// SingleTenantScope is the scope SingleTenant gives every request.
const SingleTenantScope = "global"

// SingleTenant gives every request SingleTenantScope. In a multi-tenant API
// it would replay one tenant's response to another.
func SingleTenant(*http.Request) (string, error) { return SingleTenantScope, nil }

// FingerprintFunc computes a request's fingerprint; it must be deterministic.
type FingerprintFunc func(r *http.Request, body []byte) []byte

// Store is the database seam: a driver such as idempgx.New or idemsqlite.Open.
type Store = idemdriver.Driver

// NewMiddleware is the Middleware of store configured by o: it validates o
// after WithDefaults, and the error names every field by its path
// (Engine.Lease.Duration, Request.MaxBytes...).
func NewMiddleware(store Store, o Options) (*Middleware, error) {
	o = o.WithDefaults()
	if err := invalid("Options", o.validate(store)); err != nil {
		return nil, err
	}
	m := &Middleware{eng: newEngine(store, o.Engine, o.Replay.Cache), o: o,
		methods: map[string]bool{}, replay: map[string]bool{}}
	for _, meth := range o.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	for _, h := range o.Replay.Headers {
		if k := http.CanonicalHeaderKey(h); !neverReplayed[k] {
			m.replay[k] = true
		}
	}
	m.body = httpread.Body{Limit: o.Request.MaxBytes, DiscardBytes: o.Request.Drain.Bytes, DiscardTimeout: o.Request.Drain.Timeout}
	return m, nil
}

// NewEngineWith is the Engine of store configured by o: it validates o
// after WithDefaults, and the error names every field by its path
// (Lease.Duration, Waiting.Max...).
func NewEngineWith(store Store, o EngineOptions) (*Engine, error) {
	o = o.WithDefaults()
	if err := invalid("EngineOptions", o.validate(store, "")); err != nil {
		return nil, err
	}
	return newEngine(store, o, ReplayCacheOptions{}), nil
}

// WithDefaults returns o with every zero field set to its default.
func (o EngineOptions) WithDefaults() EngineOptions {
	o.Lease.Duration = cmp.Or(o.Lease.Duration, DefaultLeaseDuration)
	o.Retention = cmp.Or(o.Retention, DefaultRetention)
	o.Response.MaxBytes = cmp.Or(o.Response.MaxBytes, DefaultMaxResponseBytes)
	if o.Response.Outcome == nil {
		o.Response.Outcome = DefaultOutcome
	}
	o.RetryAfter.InFlight = cmp.Or(o.RetryAfter.InFlight, DefaultInFlightRetryAfter)
	o.RetryAfter.Store = cmp.Or(o.RetryAfter.Store, DefaultStoreRetryAfter)
	o.Timeouts.Claim = cmp.Or(o.Timeouts.Claim, DefaultClaimTimeout)
	o.Timeouts.Complete = cmp.Or(o.Timeouts.Complete, DefaultCompleteTimeout)
	if o.Lease.MaxExecution == 0 {
		o.Lease.MaxExecution = max(o.Lease.Duration, min(DefaultMaxExecution, o.Retention-o.Lease.Duration))
	}
	if o.Lease.Owner == "" {
		host, _ := os.Hostname()
		o.Lease.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
		if len(o.Lease.Owner) > idemdriver.MaxOwnerBytes {
			o.Lease.Owner = o.Lease.Owner[len(o.Lease.Owner)-idemdriver.MaxOwnerBytes:] // the pid end is the telling one
		}
	}
	if o.OneCommit.Enabled {
		o.OneCommit.Wait = cmp.Or(o.OneCommit.Wait, DefaultOneCommitWait)
	}
	o.Waiting.Max = cmp.Or(o.Waiting.Max, o.Waiting.Wait)
	o.Waiting.MaxWaiters = cmp.Or(o.Waiting.MaxWaiters, DefaultMaxWaiters)
	o.Waiting.Poll = cmp.Or(o.Waiting.Poll, DefaultWaitPoll)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.Engine = o.Engine.WithDefaults()
	if len(o.Methods) == 0 {
		o.Methods = DefaultMethods()
	}
	o.Request.MaxBytes = cmp.Or(o.Request.MaxBytes, DefaultMaxRequestBytes)
	o.Request.Drain.Bytes = cmp.Or(o.Request.Drain.Bytes, DefaultDiscardBytes)
	o.Request.Drain.Timeout = cmp.Or(o.Request.Drain.Timeout, DefaultDiscardTimeout)
	if o.Replay.Headers == nil {
		o.Replay.Headers = DefaultReplayHeaders()
	}
	if o.Request.Fingerprint == nil {
		o.Request.Fingerprint = fingerprint.Request
	}
	if o.Replay.Cache.Bytes > 0 && o.Replay.Cache.TTL == 0 {
		o.Replay.Cache.TTL = DefaultReplayCacheTTL
	}
	return o
}

// validate names each field it refuses by its path, after prefix ("Engine."
// under Options, "" alone).
func (o EngineOptions) validate(store Store, prefix string) []error {
	var errs []error
	// f is the path of a field.
	f := func(path string) string { return prefix + path }
	lease, retention, maxExec := f("Lease.Duration"), f("Retention"), f("Lease.MaxExecution")
	if store == nil {
		errs = append(errs, errors.New("Store is required: pass a driver, such as idempgx.New or idemsqlite.Open"))
	}
	if !o.OneCommit.Enabled && o.OneCommit.Wait != 0 {
		errs = append(errs, fmt.Errorf("%s applies to the one-commit mode only: set %s, or leave it out", f("OneCommit.Wait"), f("OneCommit.Enabled")))
	}
	if o.Lease.Duration < time.Second {
		errs = append(errs, fmt.Errorf("%s %s is below 1s", lease, o.Lease.Duration))
	}
	if o.Retention < o.Lease.Duration {
		errs = append(errs, fmt.Errorf("%s %s is shorter than %s %s", retention, o.Retention, lease, o.Lease.Duration))
	}
	if o.Lease.MaxExecution < o.Lease.Duration {
		errs = append(errs, fmt.Errorf("%s %s is shorter than %s %s", maxExec, o.Lease.MaxExecution, lease, o.Lease.Duration))
	}
	if o.Retention >= o.Lease.Duration && o.Lease.MaxExecution >= o.Lease.Duration && o.Retention < o.Lease.MaxExecution+o.Lease.Duration {
		errs = append(errs, fmt.Errorf("%s %s is shorter than %s %s + %s %s: a long execution's outcome would expire before it is replayed",
			retention, o.Retention, maxExec, o.Lease.MaxExecution, lease, o.Lease.Duration))
	}
	if rl, ok := store.(idemdriver.RetentionLimiter); ok && o.Retention > rl.MaxRetention() {
		errs = append(errs, fmt.Errorf("%s %s exceeds the store's MaxRetention %s", retention, o.Retention, rl.MaxRetention()))
	}
	if owner := o.Lease.Owner; len(owner) > idemdriver.MaxOwnerBytes || !utf8.ValidString(owner) || strings.IndexByte(owner, 0) >= 0 {
		errs = append(errs, fmt.Errorf("%s must be valid UTF-8 of at most %d bytes without NUL", f("Lease.Owner"), idemdriver.MaxOwnerBytes))
	}
	if o.Response.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%s must not be negative", f("Response.MaxBytes")))
	}
	errs = appendNegative(errs, prefix, []namedValue{
		{"RetryAfter.InFlight", int64(o.RetryAfter.InFlight)}, {"RetryAfter.Store", int64(o.RetryAfter.Store)},
		{"Timeouts.Claim", int64(o.Timeouts.Claim)}, {"Timeouts.Complete", int64(o.Timeouts.Complete)}, {"OneCommit.Wait", int64(o.OneCommit.Wait)},
		{"Waiting.Wait", int64(o.Waiting.Wait)}, {"Waiting.Max", int64(o.Waiting.Max)}, {"Waiting.Poll", int64(o.Waiting.Poll)},
		{"Waiting.MaxWaiters", int64(o.Waiting.MaxWaiters)}, {"Admission.MaxInFlight", int64(o.Admission.MaxInFlight)},
	})
	if o.Waiting.Wait > o.Waiting.Max {
		errs = append(errs, fmt.Errorf("%s %s exceeds %s %s", f("Waiting.Wait"), o.Waiting.Wait, f("Waiting.Max"), o.Waiting.Max))
	}
	errs = append(errs, o.Sealing.validate(prefix+"Sealing.")...)
	if _, ok := store.(idemdriver.TxClaimer); o.OneCommit.Enabled && store != nil && !ok {
		errs = append(errs, fmt.Errorf("%s needs a Store that implements idemdriver.TxClaimer; %T does not", f("OneCommit.Enabled"), store))
	}
	return errs
}

// namedValue is a field's path and its value (a duration, a count or a
// size), for appendNegative.
type namedValue struct {
	path string
	v    int64
}

// appendNegative appends to errs one error naming every negative field.
func appendNegative(errs []error, prefix string, fields []namedValue) []error {
	var neg []string
	for _, f := range fields {
		if f.v < 0 {
			neg = append(neg, prefix+f.path)
		}
	}
	switch len(neg) {
	case 0:
		return errs
	case 1:
		return append(errs, fmt.Errorf("%s must not be negative", neg[0]))
	}
	return append(errs, fmt.Errorf("%s and %s must not be negative", strings.Join(neg[:len(neg)-1], ", "), neg[len(neg)-1]))
}

func (s SealingOptions) validate(prefix string) []error {
	var errs []error
	seen := map[string]int{}
	for i, k := range s.Keys {
		if err := k.Validate(); err != nil {
			for _, e := range joinedErrors(err) {
				errs = append(errs, fmt.Errorf("%sKeys[%d].%w", prefix, i, e))
			}
			continue
		}
		if j, dup := seen[k.ID]; dup {
			errs = append(errs, fmt.Errorf("%sKeys[%d].ID %q repeats %sKeys[%d].ID: each key needs an id of its own", prefix, i, k.ID, prefix, j))
			continue
		}
		seen[k.ID] = i
	}
	if s.ReplayPlain && len(s.Keys) == 0 {
		errs = append(errs, fmt.Errorf("%sReplayPlain applies to a sealed engine only: set %sKeys, or leave it out", prefix, prefix))
	}
	if n := len(s.KeyHashSecret); n > 0 && n < seal.MinHashSecretBytes {
		errs = append(errs, fmt.Errorf("%sKeyHashSecret is %d bytes; it needs at least %d", prefix, n, seal.MinHashSecretBytes))
	}
	if s.KeepRequestBytes < 0 {
		errs = append(errs, fmt.Errorf("%sKeepRequestBytes must not be negative", prefix))
	}
	return errs
}

// joinedErrors is the errors errors.Join joined in err, or err alone.
func joinedErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (o Options) validate(store Store) []error {
	errs := o.Engine.validate(store, "Engine.")
	for _, m := range o.Methods {
		if !httpread.IsToken(m) {
			errs = append(errs, fmt.Errorf("Methods: %q is not a method (an RFC 9110 token)", m))
		} else if len(m) > MaxMethodLength {
			errs = append(errs, fmt.Errorf("Methods: a method is %d bytes; at most MaxMethodLength (%d)", len(m), MaxMethodLength))
		}
	}
	for _, h := range o.Replay.Headers {
		switch k := http.CanonicalHeaderKey(h); {
		case !httpread.IsToken(h):
			errs = append(errs, fmt.Errorf("Replay.Headers: %q is not a header name (an RFC 9110 token)", h))
		case neverReplayed[k]:
			// Not refused: a list that names one always started; said once.
			o.Engine.Logger.Warn("idem: Options.Replay.Headers names a header that is never replayed "+
				"(a cookie, a hop-by-hop header, or one each answer sets for itself); remove it", "header", k)
		}
	}
	if o.Scope == nil {
		errs = append(errs, errors.New("Scope is required: name the owner of each request's key (idem.SingleTenant for an API with one owner)"))
	}
	if o.Request.KeepForRedrive && len(o.Engine.Sealing.KeyHashSecret) > 0 && len(o.Engine.Sealing.Keys) == 0 {
		errs = append(errs, errors.New("Request.KeepForRedrive with Engine.Sealing.KeyHashSecret needs Sealing.Keys: the kept request holds the client's key, which must not be stored in clear"))
	}
	if o.Replay.Cache.TTL != 0 && o.Replay.Cache.Bytes == 0 {
		errs = append(errs, errors.New("Replay.Cache.TTL applies with Replay.Cache.Bytes only: set Bytes to have a cache, or leave TTL out"))
	}
	return appendNegative(errs, "", []namedValue{
		{"Request.MaxBytes", o.Request.MaxBytes},
		{"Request.Drain.Bytes", o.Request.Drain.Bytes}, {"Request.Drain.Timeout", int64(o.Request.Drain.Timeout)},
		{"Replay.Cache.Bytes", o.Replay.Cache.Bytes}, {"Replay.Cache.TTL", int64(o.Replay.Cache.TTL)},
	})
}

// invalid is the error of errs, the refusals of what (Options or
// EngineOptions), or nil for none.
func invalid(what string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idem: invalid %s: %w", what, errors.Join(errs...))
}
