package idem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Defaults of Config, per CONTRACT sections 2, 4 and 5.
const (
	DefaultLeaseDuration    = 30 * time.Second
	DefaultRetention        = 24 * time.Hour
	DefaultMaxRequestBytes  = 1 << 20 // 1 MiB
	DefaultMaxResponseBytes = 1 << 20 // 1 MiB
	DefaultStoreRetryAfter  = 1 * time.Second
	DefaultCompleteTimeout  = 10 * time.Second
	DefaultClaimTimeout     = 10 * time.Second
	DefaultMaxExecution     = 10 * time.Minute
)

// DefaultMethods are the methods protected when Config.Methods is empty.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultReplayHeaders is the allow-list of response headers stored and
// replayed when Config.ReplayHeaders is nil (CONTRACT section 5). Set-Cookie,
// hop-by-hop headers, Date and Content-Length are never replayed, whatever the
// list says.
var DefaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
	"Location", "ETag", "Last-Modified", "Link", "Cache-Control",
	// Required by RFC 9110 with the statuses they accompany (405 and 401),
	// which the default outcome policy records and replays.
	"Allow", "WWW-Authenticate",
}

// Outcome is how a finished execution is recorded.
type Outcome int

const (
	// Succeeded records SUCCEEDED with the response; later requests replay it.
	Succeeded Outcome = iota
	// Failed records FAILED (retryable); the next request runs the handler again.
	Failed
)

func (o Outcome) String() string {
	if o == Succeeded {
		return "SUCCEEDED"
	}
	return "FAILED"
}

// DefaultOutcome is the outcome policy of CONTRACT section 5: 5xx, 408
// (Request Timeout), 425 (Too Early) and 429 (Too Many Requests) are Failed,
// so a retry runs again; every other status (2xx, 3xx, the other 4xx) is
// Succeeded and replayed.
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

// MaxScopeLength is the longest scope, in bytes, that every driver stores.
const MaxScopeLength = 255

// MaxPathLength is the longest request path (escaped, in bytes) of a
// protected request; a longer one is answered 414 (problem type
// about:blank) before any claim. Every driver stores it.
const MaxPathLength = 4096

// ScopeFunc names who owns a request's key (tenant, account, principal), in
// at most MaxScopeLength bytes. Keys of different scopes never meet. An error,
// or an empty scope (most often an unauthenticated request read as the zero
// value), answers 401 with the problem type missing-scope; a longer scope is
// a server fault, answered 500. Either way the handler does not run.
type ScopeFunc func(r *http.Request) (string, error)

// FingerprintFunc computes a request's fingerprint from the request and its
// body (already read, at most MaxRequestBytes). It must be deterministic.
type FingerprintFunc func(r *http.Request, body []byte) []byte

// Config configures Middleware. The zero value of every field means its
// documented default; a Config is read once, by New.
type Config struct {
	// Store is the database driver (idempgx, idemsqlite, ...). Required.
	Store Store

	// Scope names the owner of a key. Default: every request shares the one
	// scope "global", which is only right for single-tenant APIs. The default
	// never reads a client-controlled header.
	Scope ScopeFunc

	// Methods lists the protected methods; other methods pass through
	// untouched. Default: DefaultMethods (POST, PATCH).
	Methods []string

	// KeyOptional lets a protected request without Idempotency-Key pass
	// through unprotected. Default false: a missing key is answered 400
	// (problem type missing-key).
	KeyOptional bool

	// LeaseDuration is how long a claim owns a key before another worker may
	// take it over; the lease is renewed every LeaseDuration/3 while the
	// handler runs. At least 1 s (New refuses less). Default: 30 s.
	LeaseDuration time.Duration

	// Retention is how long a key is remembered after its latest execution
	// began (each claim sets expires_at = now + Retention); past it, the key
	// names a new request, whether its record is purged yet or not, unless
	// its handler still runs under a live lease (409) or the same request's
	// execution never finished (FAILED, or its owner died: the retry
	// continues it, relaying the same key downstream). For a retention per
	// route, give each route group its own Middleware (docs/retention.md).
	// At least LeaseDuration, and at most the store's MaxRetention where it
	// has one (idemdriver.RetentionLimiter): New refuses others. Default:
	// 24 h.
	Retention time.Duration

	// MaxRequestBytes bounds the request body read for the fingerprint; a
	// larger body is answered 413 (problem type request-too-large). Default: 1 MiB.
	MaxRequestBytes int64

	// MaxResponseBytes bounds the response body stored for replay. A larger
	// response still reaches the first caller in full and is recorded as
	// SUCCEEDED without its body; later requests with the key get 410 with
	// the problem type response-not-stored, and the handler is not run
	// again. Whatever this bound, the whole response is held in memory
	// until the outcome is recorded (the caller must not see a 201 whose
	// writes then fail to commit), and Flush is deferred until then: idem
	// does not suit streaming responses. Default: 1 MiB.
	MaxResponseBytes int64

	// ReplayHeaders is the allow-list of response headers kept for replay.
	// Default: DefaultReplayHeaders.
	ReplayHeaders []string

	// Outcome maps the handler's final status code to how it is recorded.
	// Default: DefaultOutcome.
	Outcome func(status int) Outcome

	// Fingerprint replaces the request fingerprint. Default: Fingerprint
	// (SHA-256 over method, path, canonical query, media type and body).
	Fingerprint FingerprintFunc

	// StoreRetryAfter is the Retry-After sent with 503 store-unavailable.
	// Default: 1 s.
	StoreRetryAfter time.Duration

	// ClaimTimeout bounds the claim statement (a store that hangs, a lock
	// held by someone else): past it the request is answered 503
	// store-unavailable and the handler does not run. Default: 10 s.
	ClaimTimeout time.Duration

	// CompleteTimeout bounds the statements that record an outcome, which run
	// on a context detached from the client's. Default: 10 s. The statement
	// that commits the outcome is never cancelled (a cancelled wait for a
	// synchronous standby would leave it committed locally only): past the
	// bound the request is answered 503 with cause ErrCommitPending while the
	// commit goes on (docs/deployment.md).
	CompleteTimeout time.Duration

	// MaxExecution bounds how long one execution may own its key (CONTRACT
	// section 4: the work is bounded by the lease, not by the client). Past
	// it the lease is no longer renewed and the handler's context is
	// cancelled with cause ErrExecutionTimeout. What a handler without the
	// claim's transaction then answers is recorded as usual (a 5xx: FAILED,
	// the retry runs again); a handler that used the transaction has it
	// rolled back and recorded FAILED, answered 503. A handler that does not
	// return loses its key to the next request once the lease runs out. Without it a handler stuck forever would hold its
	// key (409 to every retry) for as long as its process lives. At least
	// LeaseDuration. Default: 10 min, or LeaseDuration when that is longer.
	MaxExecution time.Duration

	// RelaySecret keys the derivation of the keys relayed to downstream
	// providers (RelayKey, DeriveKey, RelayTransport). Every process serving
	// the same API must use the same secret, and keep it for as long as keys
	// are retained; changing it changes every relayed key. Default: none (a
	// plain SHA-256 derivation).
	RelaySecret []byte

	// Logger receives store errors and lost leases. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Scope == nil {
		c.Scope = func(*http.Request) (string, error) { return "global", nil }
	}
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = DefaultReplayHeaders
	}
	if c.Outcome == nil {
		c.Outcome = DefaultOutcome
	}
	if c.Fingerprint == nil {
		c.Fingerprint = Fingerprint
	}
	if c.StoreRetryAfter == 0 {
		c.StoreRetryAfter = DefaultStoreRetryAfter
	}
	if c.ClaimTimeout == 0 {
		c.ClaimTimeout = DefaultClaimTimeout
	}
	if c.CompleteTimeout == 0 {
		c.CompleteTimeout = DefaultCompleteTimeout
	}
	if c.MaxExecution == 0 {
		c.MaxExecution = max(DefaultMaxExecution, c.LeaseDuration)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("Store is required"))
	}
	if c.LeaseDuration < time.Second {
		errs = append(errs, fmt.Errorf("LeaseDuration %s is below 1s", c.LeaseDuration))
	}
	if c.Retention < c.LeaseDuration {
		errs = append(errs, fmt.Errorf("Retention %s is shorter than LeaseDuration %s", c.Retention, c.LeaseDuration))
	}
	if c.MaxExecution < c.LeaseDuration {
		errs = append(errs, fmt.Errorf("MaxExecution %s is shorter than LeaseDuration %s", c.MaxExecution, c.LeaseDuration))
	}
	if rl, ok := c.Store.(idemdriver.RetentionLimiter); ok && c.Retention > rl.MaxRetention() {
		errs = append(errs, fmt.Errorf("Retention %s exceeds the store's MaxRetention %s", c.Retention, rl.MaxRetention()))
	}
	if c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("MaxRequestBytes and MaxResponseBytes must not be negative"))
	}
	if c.StoreRetryAfter < 0 || c.CompleteTimeout < 0 || c.ClaimTimeout < 0 {
		errs = append(errs, errors.New("StoreRetryAfter, ClaimTimeout and CompleteTimeout must not be negative"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}
