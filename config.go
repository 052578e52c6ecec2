package idem

//lint:file-ignore ST1005 validation errors start with the Config field they name (Store, Retention, Interval...), as New joins them

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
)

// Defaults of Config, per CONTRACT sections 2, 4 and 5.
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
)

// DefaultMethods returns the methods protected when Config.Methods is empty:
// POST and PATCH (CONTRACT section 2). Each call returns a new slice, so no
// Config shares it with another.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// DefaultReplayHeaders returns the allow-list of response headers (and
// trailers) stored and replayed when Config.ReplayHeaders is nil (CONTRACT
// section 5). Set-Cookie, hop-by-hop headers, Date and Content-Length are
// never replayed, whatever the list says. Each call returns a new slice.
func DefaultReplayHeaders() []string {
	return []string{
		"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
		"Location", "ETag", "Last-Modified", "Link", "Cache-Control",
		// Required by RFC 9110 with the statuses they accompany (405 and 401),
		// which the default outcome policy records and replays.
		"Allow", "WWW-Authenticate",
	}
}

// Outcome is how a finished execution is recorded.
type Outcome int

const (
	// Succeeded records SUCCEEDED with the response; later requests replay it.
	Succeeded Outcome = iota
	// Failed records FAILED (retryable); the next request with the same
	// payload runs the handler again.
	Failed
	// Released records nothing: the execution's record is removed (a
	// fenced Driver.Release) and the answer reaches its caller as the
	// handler wrote it, so the next request with the key runs as a new
	// one, whatever its payload (CONTRACT section 5). In transactional mode
	// the business writes are rolled back. It is meant for answers given
	// before any side effect, such as a validation failure the client will
	// correct: released after a side effect, the corrected request would
	// run it again under a new relayed key. See ReleaseKey and
	// ReleaseValidationFailures.
	Released
)

func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "SUCCEEDED"
	case Released:
		return "RELEASED"
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

// ReleaseValidationFailures is DefaultOutcome, except that 400 (Bad
// Request), 415 (Unsupported Media Type) and 422 (Unprocessable Content)
// are Released: the key is not burned by a request the client will correct
// (Stripe saves no result when parameters fail validation). Use it only
// when your handlers answer these statuses before any side effect (they
// validate first); a handler that can answer them after one should call
// ReleaseKey on its validation path instead, and keep DefaultOutcome.
func ReleaseValidationFailures(status int) Outcome {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return Released
	}
	return DefaultOutcome(status)
}

// MaxScopeLength is the longest scope, in bytes, that every driver stores.
const MaxScopeLength = 255

// MaxPathLength is the longest request path (escaped, in bytes) of a
// protected request; a longer one is answered 414 (problem type
// about:blank) before any claim. Every driver stores it.
const MaxPathLength = 4096

// ScopeFunc names who owns a request's key (tenant, account, principal): a
// valid UTF-8 string of at most MaxScopeLength bytes without NUL bytes. Keys
// of different scopes never meet. An error, or an empty scope (most often an
// unauthenticated request read as the zero value), answers 401 with the
// problem type missing-scope; a scope that breaks the rules above is a server
// fault, answered 500 (problem type scope-unstorable) and logged. Either way
// the handler does not run.
type ScopeFunc func(r *http.Request) (string, error)

// SingleTenantScope is the scope SingleTenant gives every request.
const SingleTenantScope = "global"

// SingleTenant is the ScopeFunc of an API with one owner of every key: every
// request gets the scope SingleTenantScope ("global"). Use it only when no
// two clients' keys may belong to different tenants: in a multi-tenant API it
// would replay one tenant's response to another. Config.Scope has no
// default; set it to SingleTenant to say you mean it.
func SingleTenant(*http.Request) (string, error) { return SingleTenantScope, nil }

// FingerprintFunc computes a request's fingerprint from the request and its
// body (already read, at most MaxRequestBytes). It must be deterministic.
type FingerprintFunc func(r *http.Request, body []byte) []byte

// Store is the database seam: a driver such as idempgx.New or idemsqlite.Open.
type Store = idemdriver.Driver

// EngineConfig configures an Engine: the claim protocol, whatever the
// front (HTTP through Config, or Engine.Do). The zero value of every field
// means its default; it is read once, by NewEngine or New.
type EngineConfig struct {
	// Store is the database driver (idempgx, idemsqlite, idemmysql). Required.
	Store Store

	// LeaseDuration is how long a claim owns its key before another worker
	// may take it over; renewed every LeaseDuration/3 while the handler
	// runs (CONTRACT section 4). At least 1 s. Default: 30 s.
	LeaseDuration time.Duration

	// Retention is how long a key is remembered after its latest claim
	// (expires_at = now + Retention); past it the key names a new request,
	// unless the same request is unfinished (FAILED, or its owner died).
	// At least MaxExecution + LeaseDuration, so that every recorded outcome
	// is replayed, and at most the store's MaxRetention
	// (idemdriver.RetentionLimiter). Per-route retention: one Middleware per
	// route group (docs/retention.md). Default: 24 h.
	Retention time.Duration

	// MaxResponseBytes bounds the response body stored for replay. A larger
	// one still reaches the first caller and is recorded SUCCEEDED without
	// its body: later requests get 410 response-not-stored (Do:
	// ErrResponseNotStored), never a second run. The whole response is held
	// in memory until its outcome is recorded, so idem does not suit
	// streaming. Default: 1 MiB.
	MaxResponseBytes int64

	// Outcome maps the final status to how it is recorded (CONTRACT
	// section 5). ReleaseKey overrides it with Released; an error from Do's
	// fn is always Failed. Default: DefaultOutcome (ReleaseValidationFailures
	// releases 400, 415 and 422 instead).
	Outcome func(status int) Outcome

	// InFlightRetryAfter is the delay a 409 request-in-flight asks for
	// (Retry-After; Do: InFlightError.RetryAfter): never more than the lease
	// left or LeaseDuration, never less than 1 s. Set it near the usual
	// execution time. Default: 1 s.
	InFlightRetryAfter time.Duration

	// ClaimTimeout bounds the claim (a store that hangs, a pool that has no
	// connection): past it the answer is 503 store-unavailable and nothing
	// runs. One-commit mode: ClaimTimeout + OneCommitWait. Default: 10 s.
	ClaimTimeout time.Duration

	// CompleteTimeout bounds the statements that record an outcome. The
	// COMMIT of an outcome is never cancelled (a cancelled wait for a
	// synchronous standby leaves it committed locally only): past the bound
	// the answer is 503 with cause ErrCommitPending while it goes on
	// (docs/deployment.md). Default: 10 s.
	CompleteTimeout time.Duration

	// MaxExecution bounds how long one execution owns its key: past it the
	// lease is no longer renewed and the handler's context is cancelled
	// with cause ErrExecutionTimeout. A handler that used the claim's
	// transaction, or returned after its lease ran out, is then recorded
	// FAILED and answered 503; the retry runs again under the same relayed
	// key. Between LeaseDuration and Retention - LeaseDuration. Default:
	// 10 min, within those bounds.
	MaxExecution time.Duration

	// RelaySecret keys the keys relayed downstream (RelayKey, DeriveKey,
	// RelayTransport): the same on every process, kept as long as keys are
	// retained. Default: none (a plain SHA-256 derivation).
	RelaySecret []byte

	// Owner names this process in the records it claims (Record.Owner,
	// shown by `idem stuck`): at most idemdriver.MaxOwnerBytes bytes.
	// Default: "<hostname>/<pid>".
	Owner string

	// OneCommit selects the one-commit mode (docs/contract.md section 6):
	// the claim, the handler's writes in the claim's transaction (Tx) and
	// the completion commit together, so a crash or rollback leaves no
	// record and the retry runs at once. Only for work whose side effects
	// all live in the store's database: nothing is durable before the
	// COMMIT, so a handler that calls a provider needs the default mode.
	// The Store must implement idemdriver.TxClaimer. No lease is renewed:
	// the uncommitted claim's row lock holds the key. Default: false.
	OneCommit bool

	// OneCommitWait bounds how long a one-commit request waits for a key
	// another one-commit execution runs before it is answered 409 (on the
	// row lock for another process's execution; in the process, holding no
	// connection, for this process's). A wait is never cut short while the
	// key's claim is still being decided, and a key found completed is
	// replayed (section 6). On PostgreSQL it is the transaction's
	// lock_timeout, so it also bounds the handler's own lock waits
	// (SQLSTATE 55P03). SQLite does not use it: there every transaction
	// queues for the write lock (idemsqlite.BusyTimeout). Default: 2 s.
	OneCommitWait time.Duration

	// Logger receives store errors and lost leases, with the request's
	// context. Default: slog.Default().
	Logger *slog.Logger

	// Observer receives one Event per decision (docs/observability.md).
	// Default: none.
	Observer Observer
}

// Config configures Middleware, the HTTP front of an Engine: the engine's
// fields (EngineConfig) and those only HTTP reads. The zero value of every
// field means its default; it is read once, by New.
type Config struct {
	EngineConfig

	// Scope names the owner of a key (the authenticated tenant, account or
	// principal; never a client-controlled header). Required: an API with
	// one owner of every key says so with SingleTenant.
	Scope ScopeFunc

	// Methods lists the protected methods, matched without regard to case;
	// others pass through. Default: DefaultMethods() (POST, PATCH).
	Methods []string

	// KeyOptional lets a protected request without Idempotency-Key pass
	// through unprotected. Default: false (400 missing-key).
	KeyOptional bool

	// MaxRequestBytes bounds the body read for the fingerprint; larger:
	// 413 request-too-large. Default: 1 MiB.
	MaxRequestBytes int64

	// ReplayHeaders is the allow-list of response headers and trailers
	// kept for replay. Default: DefaultReplayHeaders().
	ReplayHeaders []string

	// Fingerprint replaces the request fingerprint. Default:
	// fingerprint.Request (CONTRACT section 2).
	Fingerprint FingerprintFunc

	// StoreRetryAfter is the Retry-After of 503 store-unavailable.
	// Default: 1 s.
	StoreRetryAfter time.Duration

	// ReplayCacheBytes, when positive, keeps about that many bytes of
	// completed keys' responses in this process, so that a retry this
	// process has replayed once is answered (replay or 422) without a
	// statement. Only SUCCEEDED records enter it; they never change until
	// they expire, so it answers what the store would, for at most
	// ReplayCacheTTL and never past the record's expires_at (this process's
	// clock). A record deleted by hand stays replayed up to ReplayCacheTTL.
	// Default: 0, no cache.
	ReplayCacheBytes int64

	// ReplayCacheTTL is the longest a response stays in the replay cache.
	// Default: 1 min when ReplayCacheBytes is set.
	ReplayCacheTTL time.Duration

	// ProblemWriter writes the answers idem makes itself (docs/problems.md),
	// for an API with its own error format; p.Type names the kind,
	// p.RetryAfter the delay to send. Answers the handler wrote never go
	// through it. Default: p.Write, RFC 9457 application/problem+json (by
	// which adapters/idemconnect recognises idem's answers).
	ProblemWriter func(w http.ResponseWriter, r *http.Request, p Problem)

	// Route names a request's route for Event.Route when it has no ServeMux
	// pattern (chi, gorilla/mux): a bounded set of names, never the raw
	// path. Default: none.
	Route func(r *http.Request) string
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c EngineConfig) WithDefaults() EngineConfig {
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	if c.Outcome == nil {
		c.Outcome = DefaultOutcome
	}
	c.InFlightRetryAfter = cmp.Or(c.InFlightRetryAfter, DefaultInFlightRetryAfter)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, DefaultClaimTimeout)
	c.CompleteTimeout = cmp.Or(c.CompleteTimeout, DefaultCompleteTimeout)
	if c.MaxExecution == 0 {
		c.MaxExecution = max(c.LeaseDuration, min(DefaultMaxExecution, c.Retention-c.LeaseDuration))
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
		if len(c.Owner) > idemdriver.MaxOwnerBytes {
			c.Owner = c.Owner[len(c.Owner)-idemdriver.MaxOwnerBytes:] // the pid end is the telling one
		}
	}
	c.OneCommitWait = cmp.Or(c.OneCommitWait, DefaultOneCommitWait)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.EngineConfig = c.EngineConfig.WithDefaults()
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods()
	}
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = DefaultReplayHeaders()
	}
	if c.Fingerprint == nil {
		c.Fingerprint = fingerprint.Request
	}
	c.StoreRetryAfter = cmp.Or(c.StoreRetryAfter, DefaultStoreRetryAfter)
	if c.ReplayCacheBytes > 0 && c.ReplayCacheTTL == 0 {
		c.ReplayCacheTTL = DefaultReplayCacheTTL
	}
	return c
}

func (c EngineConfig) validate() []error {
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
	if c.Retention >= c.LeaseDuration && c.MaxExecution >= c.LeaseDuration && c.Retention < c.MaxExecution+c.LeaseDuration {
		errs = append(errs, fmt.Errorf("Retention %s is shorter than MaxExecution %s + LeaseDuration %s: a long execution's outcome would expire before it is replayed",
			c.Retention, c.MaxExecution, c.LeaseDuration))
	}
	if rl, ok := c.Store.(idemdriver.RetentionLimiter); ok && c.Retention > rl.MaxRetention() {
		errs = append(errs, fmt.Errorf("Retention %s exceeds the store's MaxRetention %s", c.Retention, rl.MaxRetention()))
	}
	if len(c.Owner) > idemdriver.MaxOwnerBytes || !utf8.ValidString(c.Owner) || strings.IndexByte(c.Owner, 0) >= 0 {
		errs = append(errs, fmt.Errorf("Owner must be valid UTF-8 of at most %d bytes without NUL", idemdriver.MaxOwnerBytes))
	}
	if c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("MaxResponseBytes must not be negative"))
	}
	if c.InFlightRetryAfter < 0 || c.CompleteTimeout < 0 || c.ClaimTimeout < 0 || c.OneCommitWait < 0 {
		errs = append(errs, errors.New("InFlightRetryAfter, ClaimTimeout, CompleteTimeout and OneCommitWait must not be negative"))
	}
	if _, ok := c.Store.(idemdriver.TxClaimer); c.OneCommit && c.Store != nil && !ok {
		errs = append(errs, fmt.Errorf("OneCommit needs a Store that implements idemdriver.TxClaimer; %T does not", c.Store))
	}
	return errs
}

func (c Config) validate() []error {
	errs := c.EngineConfig.validate()
	if c.Scope == nil {
		errs = append(errs, errors.New("Scope is required: name the owner of each request's key (idem.SingleTenant for an API with one owner)"))
	}
	if c.MaxRequestBytes < 0 || c.StoreRetryAfter < 0 {
		errs = append(errs, errors.New("MaxRequestBytes and StoreRetryAfter must not be negative"))
	}
	if c.ReplayCacheBytes < 0 || c.ReplayCacheTTL < 0 {
		errs = append(errs, errors.New("ReplayCacheBytes and ReplayCacheTTL must not be negative"))
	}
	return errs
}

// invalid joins errs into New's and NewEngine's error, or nil.
func invalid(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idem: invalid Config: %w", errors.Join(errs...))
}
