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

// Config configures Middleware. The zero value of every field means its
// documented default; a Config is read once, by New.
type Config struct {
	// Store is the database driver (idempgx, idemsqlite, ...). Required.
	Store Store

	// Scope names the owner of a key (the tenant, account or principal the
	// request is authenticated as; never a client-controlled header).
	// Required: New refuses a nil Scope. An API with a single owner of
	// every key says so with SingleTenant.
	Scope ScopeFunc

	// Methods lists the protected methods; other methods pass through
	// untouched. Methods are matched without regard to case (a "post" is
	// protected as POST is), so a handler that matches methods
	// case-insensitively never runs unprotected. Default: DefaultMethods()
	// (POST, PATCH).
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
	//
	// A completed execution is always replayed, however long its handler
	// ran: an outcome is recorded only while its execution's lease is live,
	// which is at most MaxExecution + LeaseDuration after the claim, so New
	// refuses a Retention shorter than MaxExecution + LeaseDuration
	// (CONTRACT section 9). It also refuses more than the store's
	// MaxRetention where it has one (idemdriver.RetentionLimiter). Default:
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
	// Trailers (declared with the Trailer header, or set with
	// http.TrailerPrefix) are kept for replay by the same list. Default:
	// DefaultReplayHeaders().
	ReplayHeaders []string

	// Outcome maps the handler's final status code to how it is recorded:
	// Succeeded, Failed or Released. A handler that called ReleaseKey is
	// Released whatever its status. Default: DefaultOutcome, under which
	// every 4xx but 408, 425 and 429 is recorded and replayed, validation
	// failures included (idem cannot tell a 400 answered before any side
	// effect from one answered after); ReleaseValidationFailures releases
	// 400, 415 and 422 instead.
	Outcome func(status int) Outcome

	// Fingerprint replaces the request fingerprint. Default: Fingerprint
	// (SHA-256 over method, path, canonical query, media type and body).
	Fingerprint FingerprintFunc

	// StoreRetryAfter is the Retry-After sent with 503 store-unavailable.
	// Default: 1 s.
	StoreRetryAfter time.Duration

	// InFlightRetryAfter is the delay a 409 request-in-flight asks for in
	// its Retry-After header, so that a client that honours it comes back
	// soon after a typical execution ends. The header says this delay, but
	// never more than what is left of the owner's lease, never more than
	// LeaseDuration, and never less than 1 s (CONTRACT section 3). Set it
	// near your routes' usual execution time. Default: 1 s.
	InFlightRetryAfter time.Duration

	// ClaimTimeout bounds the claim statement (a store that hangs, a lock
	// held by someone else): past it the request is answered 503
	// store-unavailable and the handler does not run. In the one-commit
	// mode the bound is ClaimTimeout + OneCommitWait. Default: 10 s.
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
	// the retry runs again) if it returns while its lease is still live; a
	// handler that used the transaction has it rolled back and recorded
	// FAILED, answered 503. A handler that returns after its lease ran out
	// is not recorded as it answered (its key may have been taken over, or
	// its record may expire before anyone replays it): it is recorded
	// FAILED and answered 503, and the retry runs again under the same
	// relayed key. A handler that does not return loses its key to the next
	// request once the lease runs out. Without it a handler stuck forever
	// would hold its key (409 to every retry) for as long as its process
	// lives. At least LeaseDuration, and at most Retention - LeaseDuration.
	// Default: 10 min, but no more than Retention - LeaseDuration and no
	// less than LeaseDuration.
	MaxExecution time.Duration

	// RelaySecret keys the derivation of the keys relayed to downstream
	// providers (RelayKey, DeriveKey, RelayTransport). Every process serving
	// the same API must use the same secret, and keep it for as long as keys
	// are retained; changing it changes every relayed key. Default: none (a
	// plain SHA-256 derivation).
	RelaySecret []byte

	// Owner names this process in the records it claims (Record.Owner,
	// shown by the idem command's stuck and inspect), so an operator can
	// tell whose worker died; at most idemdriver.MaxOwnerBytes bytes (New
	// refuses longer). Default: "<hostname>/<pid>".
	Owner string

	// OneCommit selects the one-commit mode (docs/contract.md, "Modes";
	// CONTRACT section 10): the claim, the handler's writes in the claim's
	// transaction (idempgx.Tx, idemmysql.Tx, idemsqlite.Tx) and the
	// completion are one transaction with one COMMIT, so a crash or a
	// rollback leaves no record and no lease, and the retry runs at once. Only
	// for handlers whose side effects all live in the store's database: the
	// claim is not durable before the handler runs, so a handler that calls
	// a provider (with a relayed key) must use the default mode, whose claim
	// commits first and survives a crash. The Store must implement
	// idemdriver.TxClaimer (New refuses one that does not). The handler
	// always runs in the transaction; a 5xx answer (FAILED), ReleaseKey or
	// a panic roll it back, claim included. No lease is renewed: the
	// uncommitted claim's row lock holds the key. Default: false.
	OneCommit bool

	// OneCommitWait bounds how long a request waits for a key that a
	// one-commit execution holds (in the process, or on the key's row
	// lock), before it is answered 409
	// request-in-flight; when the owner commits first, the request gets the
	// replay. A request waiting on the row lock holds a connection of the
	// store's pool, so the requests of one key in this process claim one
	// wave at a time: while the first claims or runs the key, the others
	// wait in the process, holding none, for at most OneCommitWait
	// (docs/contract.md section 6). The one-commit claim, the wait for a
	// pool connection included, is bounded by ClaimTimeout + OneCommitWait
	// (503 past it). On PostgreSQL it is the transaction's lock_timeout, so
	// it also bounds the handler's own lock waits in the claim's
	// transaction (SQLSTATE 55P03); on MySQL/MariaDB only the claim's.
	// SQLite does not use it: there a request waits for the database's
	// single write lock (idemsqlite.BusyTimeout), which every key's
	// transaction takes, and gets the replay once the owner commits (its
	// wait in the process is bounded by the owner's transaction). Default:
	// 2 s.
	OneCommitWait time.Duration

	// ReplayCacheBytes, when positive, keeps the responses of completed
	// keys in this process's memory, up to about that many bytes (body,
	// headers and key; least recently and least frequently used evicted
	// first), so that a retry of a request this process has already
	// replayed once is answered without the store: its replay, or its 422
	// key-reused, costs no statement. Only SUCCEEDED records enter it, as a
	// replay read them from the store: a completed record never changes
	// until it expires, so the cache never answers what the store would
	// not, with two bounds on how long it keeps an answer: ReplayCacheTTL,
	// and the record's expires_at read on this process's clock (a retry
	// after the key expired runs again, as Retention promises, give or take
	// the skew between this process's clock and the database's). An
	// operator who deletes a SUCCEEDED record by hand (`idem release
	// --force`, or SQL) sees it replayed from the cache up to ReplayCacheTTL
	// longer, by each process that had replayed it. In flight (409) and
	// every first execution always go to the store. Used by the HTTP
	// middleware, in both modes; Engine.Do does not. Default: 0, no cache.
	ReplayCacheBytes int64

	// ReplayCacheTTL is the longest a response stays in the replay cache
	// after it was read from the store. Default: 1 min when
	// ReplayCacheBytes is set.
	ReplayCacheTTL time.Duration

	// Logger receives store errors and lost leases, each call with the
	// request's context (Logger.ErrorContext and the like), so a handler
	// that carries trace ids in its context finds them in idem's records.
	// Default: slog.Default().
	Logger *slog.Logger

	// Observer receives one Event per decision (executed, replayed, in
	// flight, key reused, released, taken over, lease lost, store
	// unavailable, completion failed) with its route, attempt, status and
	// durations: the hook for metrics and traces (docs/observability.md).
	// Default: none (nil), and no event is built.
	Observer Observer

	// ProblemWriter writes the error answers idem makes itself (every
	// problem of docs/problems.md: 400 missing-key, 409 request-in-flight,
	// 422 key-reused, 503 store-unavailable, ...), so an API can answer in
	// its own error format (Stripe's error object, for one). p is the
	// problem idem would send: p.Type names the kind (ProblemTypeBase + the
	// slug), p.Status the status, p.RetryAfter the delay to send as
	// Retry-After. The writer chooses the status, headers and body it sends;
	// Event.Status reports the status it wrote. Answers the handler wrote
	// (and their replays) never go through it. Default: nil, p.Write: RFC
	// 9457 problem details as application/problem+json, by which
	// adapters/idemconnect recognises idem's answers (a ProblemWriter that
	// sends another Content-Type makes idemconnect pass them through as the
	// handler's).
	ProblemWriter func(w http.ResponseWriter, r *http.Request, p Problem)

	// Route names a request's route for Event.Route when the request has no
	// ServeMux pattern (r.Pattern is empty: chi, gorilla/mux, or idem
	// wrapping the ServeMux itself). Return a bounded set of names, such as
	// the router's route template: never the raw path, whose cardinality a
	// metric cannot bear. Default: none (Event.Route is "").
	Route func(r *http.Request) string
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods()
	}
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = DefaultReplayHeaders()
	}
	if c.Outcome == nil {
		c.Outcome = DefaultOutcome
	}
	if c.Fingerprint == nil {
		c.Fingerprint = fingerprint.Request
	}
	c.StoreRetryAfter = cmp.Or(c.StoreRetryAfter, DefaultStoreRetryAfter)
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
	if c.ReplayCacheBytes > 0 && c.ReplayCacheTTL == 0 {
		c.ReplayCacheTTL = DefaultReplayCacheTTL
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate(forHTTP bool) error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("Store is required"))
	}
	if c.Scope == nil && forHTTP {
		errs = append(errs, errors.New("Scope is required: name the owner of each request's key (idem.SingleTenant for an API with one owner)"))
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
		// An outcome recorded late in a long execution would expire before
		// (or soon after) it is recorded, and the retry would run again.
		errs = append(errs, fmt.Errorf("Retention %s is shorter than MaxExecution %s + LeaseDuration %s: a long execution's outcome would expire before it is replayed",
			c.Retention, c.MaxExecution, c.LeaseDuration))
	}
	if rl, ok := c.Store.(idemdriver.RetentionLimiter); ok && c.Retention > rl.MaxRetention() {
		errs = append(errs, fmt.Errorf("Retention %s exceeds the store's MaxRetention %s", c.Retention, rl.MaxRetention()))
	}
	if len(c.Owner) > idemdriver.MaxOwnerBytes || !utf8.ValidString(c.Owner) || strings.IndexByte(c.Owner, 0) >= 0 {
		errs = append(errs, fmt.Errorf("Owner must be valid UTF-8 of at most %d bytes without NUL", idemdriver.MaxOwnerBytes))
	}
	if c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("MaxRequestBytes and MaxResponseBytes must not be negative"))
	}
	if c.StoreRetryAfter < 0 || c.InFlightRetryAfter < 0 || c.CompleteTimeout < 0 || c.ClaimTimeout < 0 {
		errs = append(errs, errors.New("StoreRetryAfter, InFlightRetryAfter, ClaimTimeout and CompleteTimeout must not be negative"))
	}
	if c.ReplayCacheBytes < 0 || c.ReplayCacheTTL < 0 {
		errs = append(errs, errors.New("ReplayCacheBytes and ReplayCacheTTL must not be negative"))
	}
	errs = append(errs, c.validateOneCommit()...)
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}
