package idem

import (
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/protocol"
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
