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
	"github.com/idemgo/idem/internal/httpread"
	"github.com/idemgo/idem/internal/protocol"
	"github.com/idemgo/idem/seal"
)

// Defaults of Config (CONTRACT sections 2, 4 and 5).
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

// DefaultMethods returns POST and PATCH (CONTRACT section 2), a new slice each call.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// DefaultReplayHeaders returns the replayed headers and trailers (CONTRACT
// section 5), a new slice each call. Set-Cookie, hop-by-hop headers, Date,
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

// DefaultMaxWaiters is the default of EngineConfig.MaxWaiters.
const DefaultMaxWaiters = 1000

// DefaultWaitPoll is the default of EngineConfig.WaitPoll; where the store
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

// EngineConfig configures an Engine. A zero field means its default; it is
// read once, by NewEngine or New.
type EngineConfig struct {
	// Store is the database driver. Default: none (required).
	Store Store

	// LeaseDuration is how long a claim owns its key, renewed every
	// LeaseDuration/3 (CONTRACT section 4); at least 1 s. Default: 30 s.
	LeaseDuration time.Duration

	// Retention is how long a key is remembered after its latest claim: at least
	// MaxExecution + LeaseDuration, at most the store's MaxRetention
	// (idemdriver.RetentionLimiter). Per-route retention: one Middleware per route
	// group (docs/retention.md). Default: 24 h.
	Retention time.Duration

	// MaxResponseBytes bounds the body stored for replay; a larger one gets
	// 410 response-not-stored later (Do: ErrResponseNotStored). The response is
	// held in memory until recorded. Default: 1 MiB.
	MaxResponseBytes int64

	// Outcome maps the final status to its recording (CONTRACT section 5);
	// ReleaseKey overrides it, and an error from Do's fn is always Failed.
	// Default: DefaultOutcome.
	Outcome func(status int) Outcome

	// InFlightRetryAfter is the Retry-After of 409 request-in-flight (Do:
	// InFlightError.RetryAfter), within 1 s and the lease left. Default: 1 s.
	InFlightRetryAfter time.Duration

	// ClaimTimeout bounds the claim (then 503); one-commit mode adds
	// OneCommitWait. Default: 10 s.
	ClaimTimeout time.Duration

	// CompleteTimeout bounds recording an outcome; a COMMIT is never cancelled,
	// its 503 has cause ErrCommitPending (docs/deployment.md). Default: 10 s.
	CompleteTimeout time.Duration

	// MaxExecution bounds an execution: then the context is cancelled with
	// ErrExecutionTimeout, and one that used the claim's transaction or outlived
	// its lease is recorded FAILED (503). Between LeaseDuration and Retention -
	// LeaseDuration. Default: 10 min, within those bounds.
	MaxExecution time.Duration

	// MaxInFlight bounds the executions in flight in this engine: the
	// requests (and Do calls) between the start of their claim and the
	// recording of their outcome, a wait for the owner's outcome included.
	// One more is refused before it claims, so nothing is claimed, run or
	// charged: 503 overloaded with Retry-After StoreRetryAfter (Do:
	// ErrOverloaded). A replay from the replay cache is not counted. Size it
	// from the lease, the pool and the handler's time (docs/deployment.md,
	// "Leases under load"). Not negative. Default: 0, no bound.
	MaxInFlight int

	// RelaySecret keys RelayKey, the same on every process. Default: none (a
	// plain SHA-256).
	RelaySecret []byte

	// Owner names this process in its records, at most idemdriver.MaxOwnerBytes
	// bytes. Default: "<hostname>/<pid>".
	Owner string

	// OneCommit selects the one-commit mode (CONTRACT section 6): claim, writes
	// and completion commit together, so only for side effects in the store's
	// database; the Store must implement idemdriver.TxClaimer. Default: false.
	OneCommit bool

	// OneCommitWait bounds a one-commit request's wait for a running key before
	// 409; on PostgreSQL it is also the lock_timeout (SQLSTATE 55P03). SQLite
	// does not use it (idemsqlite.BusyTimeout). Only with OneCommit (New
	// refuses it otherwise). Default: 2 s.
	OneCommitWait time.Duration

	// Wait is how long a duplicate that finds its request in flight waits for
	// the owner's outcome, holding no connection, to get the owner's answer
	// (a replay) instead of 409 request-in-flight; 409 once it runs out
	// (docs/contract.md "Waiting for the owner"). A request's Prefer: wait=N
	// (RFC 7240 section 4.3: N seconds, 0 for none; the first wait preference
	// counts) or DoParams.Wait asks for another wait, capped at MaxWait. Default:
	// 0, 409 at once.
	Wait time.Duration

	// MaxWait bounds the wait a request asks for. Default: Wait.
	MaxWait time.Duration

	// MaxWaiters bounds the duplicates waiting at once in this process; the
	// next one is answered 409. Each holds its request body. Default: 1000.
	MaxWaiters int

	// WaitPoll is how often a waiter reads its key's record when the store
	// sends no notifications (idemdriver.Notifier: MariaDB, SQLite,
	// PostgreSQL behind a transaction pooler, docs/deployment.md); ten times
	// less often where it does. Default: 100 ms.
	WaitPoll time.Duration

	// Logger receives store errors and lost leases. Default: slog.Default().
	Logger *slog.Logger

	// Observer receives one Event per decision. Default: none.
	Observer Observer

	// SealKeys seal what a record keeps of a response (its headers and body,
	// as one blob) and of its request (KeepRequestBytes) with AES-GCM, bound
	// to the record (package seal, docs/sealing.md). The first key seals new
	// records, every one opens: rotate by putting a new key first, and remove
	// the old one once every record it sealed has expired (Retention). Status,
	// body size and the other columns stay plain. A record sealed under an id
	// not listed is answered 500 seal-key-missing (Do: ErrSealKeyMissing),
	// one whose blob does not authenticate 500 seal-broken (ErrSealBroken);
	// neither is ever run again; nor is a record stored plain, answered 500
	// seal-broken unless ReplayPlain is set. Each key: an ID of 1 to seal.MaxKeyIDLength
	// (32) bytes of ASCII letters, digits, '.', '_' or '-', unique among the
	// keys, and a Secret of 16, 24 or 32 bytes. Turn it on once every process
	// runs a version that opens sealed records. Default: none (stored plain).
	SealKeys []seal.Key

	// ReplayPlain lets an engine with SealKeys replay a SUCCEEDED record
	// stored plain (its seal_key empty), as every record written before
	// SealKeys were set is. Without it such a record is answered 500
	// seal-broken (Do: ErrSealBroken), logged, and never run again: whoever
	// can write idem_keys but holds no sealing key cannot plant a response
	// (a plain body under an emptied seal_key) for a sealed server to replay.
	// Set it only while switching a table that holds plain records to
	// sealing, and remove it once every plain record has expired (Retention,
	// plus the purge's grace; docs/sealing.md): meanwhile a planted plain
	// record is replayed. Only with SealKeys (New refuses it otherwise).
	// Default: false (with SealKeys, sealed records only).
	ReplayPlain bool

	// KeyHashSecret, when set, stores each key as seal.HashKey(KeyHashSecret,
	// key), "h1_" and the hex HMAC-SHA256 of the client's key, in every
	// statement and fence, so idem_keys shows no client key (Engine.StoredKey
	// computes it; the idem CLI takes the secret and finds a record from the
	// plain key). The scope stays plain; RelayKey still derives from the
	// client's key. At least 16 bytes, the same on every process. Setting it
	// or changing it on a table that holds live records makes those records
	// unfindable (their retries run again): do it on a new table, or once
	// every earlier record's Retention has passed (docs/sealing.md). Default:
	// none (the key stored as sent).
	KeyHashSecret []byte

	// KeepRequestBytes keeps, for an audit, the first KeepRequestBytes bytes
	// of each recorded request's body (Do: the Payload) with its full size
	// (flagged truncated when larger) and, over HTTP, its query string and
	// Content-Type, in the record's request column, sealed like the response
	// when SealKeys are set (seal.Request; `idem inspect --request` shows it).
	// It is written with the completion, so SUCCEEDED records keep it and
	// FAILED ones do not; it goes with the record (purge, release). Not
	// negative. Default: 0 (no request kept).
	KeepRequestBytes int64
}

// Config configures Middleware: an EngineConfig and the HTTP fields. A zero
// field means its default; it is read once, by New.
type Config struct {
	EngineConfig

	// Scope names a key's owner (never a client-controlled header); SingleTenant
	// for one owner. Default: none (required).
	Scope ScopeFunc

	// Methods lists the protected methods, any case. Default: POST, PATCH.
	Methods []string

	// KeyOptional lets a keyless request pass unprotected. Default: false (400).
	KeyOptional bool

	// MaxRequestBytes bounds the body (413 beyond). Default: 1 MiB.
	MaxRequestBytes int64

	// DiscardBytes and DiscardTimeout bound what idem reads, and drops, of a
	// body over MaxRequestBytes before its 413 over HTTP/1.x, so that a client
	// still sending reads the answer instead of a reset connection (RFC 9112
	// section 9.6): a body that ends within MaxRequestBytes + DiscardBytes
	// bytes in all, and within DiscardTimeout of the 413's decision (a read
	// deadline, http.ResponseController), is read to its end and the
	// connection kept. Past either, and for a client that sent "Expect:
	// 100-continue" with a declared length over the limit (it gets the 413
	// instead of "100 Continue"), the 413 is answered at once with
	// "Connection: close". HTTP/2 and HTTP/3 read nothing: the answer ends
	// the request's stream, not the connection. Not negative. Defaults: 4 MiB
	// and 10 s.
	DiscardBytes   int64
	DiscardTimeout time.Duration

	// ReplayHeaders lists the replayed headers. Default: DefaultReplayHeaders().
	ReplayHeaders []string

	// Fingerprint replaces the request fingerprint. Default: fingerprint.Request.
	Fingerprint FingerprintFunc

	// StoreRetryAfter is the Retry-After of 503 store-unavailable. Default: 1 s.
	StoreRetryAfter time.Duration

	// ReplayCacheBytes bounds an in-process cache of SUCCEEDED responses that
	// answers retries without a statement, for at most ReplayCacheTTL and never
	// past expires_at; a record deleted by hand stays replayed up to
	// ReplayCacheTTL. Default: 0, no cache.
	ReplayCacheBytes int64

	// ReplayCacheTTL bounds a cached response's life. Default: 1 min.
	ReplayCacheTTL time.Duration

	// ProblemWriter writes idem's own answers in the API's error format.
	// Default: Problem.Write (RFC 9457; adapters/idemconnect recognises it).
	ProblemWriter func(w http.ResponseWriter, r *http.Request, p Problem)

	// Route names a route for Event.Route when there is no ServeMux pattern; a
	// bounded set, never the raw path. Default: none.
	Route func(r *http.Request) string
}

// WithDefaults returns c with every zero field set to its default.
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
	if c.OneCommit {
		c.OneCommitWait = cmp.Or(c.OneCommitWait, DefaultOneCommitWait)
	}
	c.MaxWait = cmp.Or(c.MaxWait, c.Wait)
	c.MaxWaiters = cmp.Or(c.MaxWaiters, DefaultMaxWaiters)
	c.WaitPoll = cmp.Or(c.WaitPoll, DefaultWaitPoll)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.EngineConfig = c.EngineConfig.WithDefaults()
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods()
	}
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.DiscardBytes = cmp.Or(c.DiscardBytes, DefaultDiscardBytes)
	c.DiscardTimeout = cmp.Or(c.DiscardTimeout, DefaultDiscardTimeout)
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
	if !c.OneCommit && c.OneCommitWait != 0 {
		errs = append(errs, errors.New("OneCommitWait applies to the one-commit mode only: set OneCommit, or leave it out"))
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
	if c.MaxInFlight < 0 {
		errs = append(errs, errors.New("MaxInFlight must not be negative"))
	}
	if c.Wait < 0 || c.MaxWait < 0 || c.MaxWaiters < 0 || c.WaitPoll < 0 {
		errs = append(errs, errors.New("Wait, MaxWait, MaxWaiters and WaitPoll must not be negative"))
	}
	if c.Wait > c.MaxWait {
		errs = append(errs, fmt.Errorf("Wait %s exceeds MaxWait %s", c.Wait, c.MaxWait))
	}
	errs = append(errs, c.validateSealing()...)
	if _, ok := c.Store.(idemdriver.TxClaimer); c.OneCommit && c.Store != nil && !ok {
		errs = append(errs, fmt.Errorf("OneCommit needs a Store that implements idemdriver.TxClaimer; %T does not", c.Store))
	}
	return errs
}

func (c EngineConfig) validateSealing() []error {
	var errs []error
	seen := map[string]int{}
	for i, k := range c.SealKeys {
		if err := k.Validate(); err != nil {
			for _, e := range joinedErrors(err) {
				errs = append(errs, fmt.Errorf("SealKeys[%d].%w", i, e))
			}
			continue
		}
		if j, dup := seen[k.ID]; dup {
			errs = append(errs, fmt.Errorf("SealKeys[%d].ID %q repeats SealKeys[%d].ID: each key needs an id of its own", i, k.ID, j))
			continue
		}
		seen[k.ID] = i
	}
	if c.ReplayPlain && len(c.SealKeys) == 0 {
		errs = append(errs, errors.New("ReplayPlain applies to a sealed engine only: set SealKeys, or leave it out"))
	}
	if n := len(c.KeyHashSecret); n > 0 && n < seal.MinHashSecretBytes {
		errs = append(errs, fmt.Errorf("KeyHashSecret is %d bytes; it needs at least %d", n, seal.MinHashSecretBytes))
	}
	if c.KeepRequestBytes < 0 {
		errs = append(errs, errors.New("KeepRequestBytes must not be negative"))
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

func (c Config) validate() []error {
	errs := c.EngineConfig.validate()
	for _, m := range c.Methods {
		if !httpread.IsToken(m) {
			errs = append(errs, fmt.Errorf("Methods: %q is not a method (an RFC 9110 token)", m))
		}
	}
	if c.Scope == nil {
		errs = append(errs, errors.New("Scope is required: name the owner of each request's key (idem.SingleTenant for an API with one owner)"))
	}
	if c.MaxRequestBytes < 0 || c.StoreRetryAfter < 0 {
		errs = append(errs, errors.New("MaxRequestBytes and StoreRetryAfter must not be negative"))
	}
	if c.DiscardBytes < 0 || c.DiscardTimeout < 0 {
		errs = append(errs, errors.New("DiscardBytes and DiscardTimeout must not be negative"))
	}
	if c.ReplayCacheBytes < 0 || c.ReplayCacheTTL < 0 {
		errs = append(errs, errors.New("ReplayCacheBytes and ReplayCacheTTL must not be negative"))
	}
	return errs
}

func invalid(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idem: invalid Config: %w", errors.Join(errs...))
}
