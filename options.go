package idem

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem/seal"
)

// Options configures Middleware, given to NewMiddleware with its Store. A
// zero field means its default; NewMiddleware reads it once, and no field
// holds runtime state.
//
// The fields are laid out by feature: Scope, Methods and KeyOptional say
// which requests are protected and whose keys they carry; Engine holds the
// protocol's settings (the claim's lease, retention, timeouts, the recorded
// response, waiting, the one-commit mode, sealing, admission), which Do
// shares through NewEngineWith; Request bounds what is read of a request,
// Replay what is replayed and cached of a response; ProblemWriter and Route
// shape idem's own answers and events. Each feature's settings are one
// group (a struct of its own, named for the feature), so what goes together
// reads together: a new feature (recovery, notification...) gets a group of
// its own, and the groups already here do not change.
type Options struct {
	// Scope names a key's owner (never a client-controlled header); SingleTenant
	// for one owner. Default: none (required).
	Scope ScopeFunc

	// Engine holds the protocol's settings, shared with NewEngineWith.
	Engine EngineOptions

	// Methods lists the protected methods, any case. Default: POST, PATCH.
	Methods []string

	// KeyOptional lets a keyless request pass unprotected: its handler runs
	// with no execution (idem.Tx and Step return ErrNoExecution; it opens
	// its own transaction). Default: false (400).
	KeyOptional bool

	// Request bounds what is read of a protected request.
	Request RequestOptions

	// Replay says what of a response is replayed, and caches replays.
	Replay ReplayOptions

	// ProblemWriter writes idem's own answers in the API's error format,
	// p.NewKeySafe included where the format has room (docs/problems.md).
	// idem sets the answer's Retry-After (p.RetryAfter, in whole seconds)
	// and Cache-Control: no-store on w before calling it. It also writes
	// the 500 of a handler that panicked (an about:blank problem), but for
	// a framework adapter's requests, which the adapter answers.
	// Default: Problem.Write (RFC 9457; adapters/idemconnect recognises it).
	ProblemWriter func(w http.ResponseWriter, r *http.Request, p Problem)

	// Route names a route for Event.Route when there is no ServeMux pattern; a
	// bounded set, never the raw path. Default: none.
	Route func(r *http.Request) string
}

// RequestOptions bounds what is read of a protected request (Options.Request).
type RequestOptions struct {
	// MaxBytes bounds the body (413 beyond). Default: 1 MiB.
	MaxBytes int64

	// Drain bounds what is read, and dropped, of a body over MaxBytes.
	Drain DrainOptions

	// Fingerprint replaces the request fingerprint. Default: fingerprint.Request.
	Fingerprint FingerprintFunc

	// KeepForRedrive keeps, before an execution's first step (Step), what
	// a completer needs to run the request again without its client
	// (docs/contract.md section 11.4, package completer): its query, body
	// and Content-Type, its Idempotency-Key, and its headers but
	// Authorization, Proxy-Authorization, Cookie and what Redact removes.
	// It is kept once per record life, as an internal step
	// (idemdriver.KeptRequestStep), sealed with Engine.Sealing.Keys, and
	// goes with the record. With Engine.Sealing.KeyHashSecret it needs
	// Sealing.Keys: the key is kept. Default: false (nothing kept: the
	// completer leaves such executions to their clients' retries, and holds
	// an at-most-once step's start UNKNOWN shortly before its record
	// expires).
	KeepForRedrive bool

	// Redact removes from a kept request's headers (KeepForRedrive) what
	// must never be stored: a signature, a token in another header. The
	// completer rebuilds credentials from the scope instead. Default: none.
	Redact func(h http.Header)
}

// DrainOptions bounds what idem reads, and drops, of a body over
// Request.MaxBytes before its 413 over HTTP/1.x, so that a client still
// sending reads the answer instead of a reset connection (RFC 9112 section
// 9.6): a body that ends within Request.MaxBytes + Bytes bytes in all, and
// within Timeout of the 413's decision (a read deadline,
// http.ResponseController), is read to its end and the connection kept.
// Past either, and for a client that sent "Expect: 100-continue" with a
// declared length over the limit (it gets the 413 instead of "100
// Continue"), the 413 is answered at once with "Connection: close". HTTP/2
// and HTTP/3 read nothing: the answer ends the request's stream, not the
// connection.
type DrainOptions struct {
	// Bytes is how much more than Request.MaxBytes is read. Not negative.
	// Default: 4 MiB.
	Bytes int64
	// Timeout bounds the reading. Not negative. Default: 10 s.
	Timeout time.Duration
}

// ReplayOptions says what of a response is replayed (Options.Replay).
type ReplayOptions struct {
	// Headers lists the replayed headers; it replaces the default list,
	// so add to it with append(idem.DefaultReplayHeaders(), "X-Charge-Id")
	// (a list without Content-Type replays a body whose type net/http
	// sniffs). NewMiddleware refuses a name that is not a header name, and
	// logs one that is never replayed (Set-Cookie, hop-by-hop headers,
	// Date, Content-Length, the headers idem sets for each answer). Default:
	// DefaultReplayHeaders().
	Headers []string

	// Cache answers retries from memory.
	Cache ReplayCacheOptions
}

// ReplayCacheOptions configures an in-process cache of SUCCEEDED responses
// (and of 422s) that answers retries without a statement, for at most TTL
// and never past expires_at; a record deleted by hand stays replayed up to
// TTL. It belongs to the Middleware's Engine: Do on Middleware.Engine()
// answers from it too.
type ReplayCacheOptions struct {
	// Bytes bounds the cache. Not negative. Default: 0, no cache.
	Bytes int64
	// TTL bounds a cached response's life. Not negative; only with Bytes
	// (NewMiddleware refuses it otherwise). Default: 1 min (with Bytes).
	TTL time.Duration
}

// EngineOptions configures an Engine, given to NewEngineWith with its Store
// (and to Middleware as Options.Engine). A zero field means its default; it
// is read once, and no field holds runtime state. Each feature's settings
// are a group of their own (Options says how the groups are laid out).
type EngineOptions struct {
	// Lease is the claim's lease.
	Lease LeaseOptions

	// Retention is how long a key is remembered after its latest claim: at least
	// Lease.MaxExecution + Lease.Duration, at most the store's MaxRetention
	// (idemdriver.RetentionLimiter). Per-route retention: one Middleware per route
	// group (docs/retention.md). Default: 24 h.
	Retention time.Duration

	// Timeouts bound the claim and the recording of an outcome.
	Timeouts TimeoutOptions

	// Response says how a response is recorded.
	Response ResponseOptions

	// RetryAfter is the Retry-After of idem's 409 and 503 answers.
	RetryAfter RetryAfterOptions

	// Waiting lets a duplicate wait for its key's execution in flight.
	Waiting WaitOptions

	// OneCommit selects the one-commit mode.
	OneCommit OneCommitOptions

	// Sealing seals what records keep, and hashes their keys.
	Sealing SealingOptions

	// Admission bounds the executions in flight.
	Admission AdmissionOptions

	// RelaySecret keys RelayKey, the same on every process. Default: none (a
	// plain SHA-256).
	RelaySecret []byte

	// Logger receives store errors and lost leases. Default: slog.Default().
	Logger *slog.Logger

	// Observer receives one Event per decision. Default: none.
	Observer Observer
}

// LeaseOptions configures the claim's lease (CONTRACT section 4).
type LeaseOptions struct {
	// Duration is how long a claim owns its key, renewed every Duration/3
	// (CONTRACT section 4); at least 1 s. Default: 30 s.
	Duration time.Duration

	// MaxExecution bounds an execution: then the context is cancelled with
	// ErrExecutionTimeout, and one that used the claim's transaction or outlived
	// its lease is recorded FAILED (503); in one-commit mode its writes are
	// rolled back, and its key is held until the handler returns (CONTRACT
	// section 6). Between Lease.Duration and Retention - Lease.Duration.
	// Default: 10 min, within those bounds.
	MaxExecution time.Duration

	// Owner names this process in its records, at most idemdriver.MaxOwnerBytes
	// bytes. Default: "<hostname>/<pid>".
	Owner string
}

// TimeoutOptions bounds the store's statements (EngineOptions.Timeouts).
type TimeoutOptions struct {
	// Claim bounds the claim (then 503); one-commit mode adds OneCommit.Wait.
	// Default: 10 s.
	Claim time.Duration

	// Complete bounds recording an outcome; a COMMIT is never cancelled,
	// its 503 has cause ErrCommitPending (docs/deployment.md). Default: 10 s.
	Complete time.Duration
}

// ResponseOptions says how a response is recorded (EngineOptions.Response).
type ResponseOptions struct {
	// MaxBytes bounds the body stored for replay; a larger one gets
	// 410 response-not-stored later (Do: ErrResponseNotStored). The response is
	// held in memory until recorded. Default: 1 MiB.
	MaxBytes int64

	// Outcome maps the final status to its recording (CONTRACT section 5);
	// ReleaseKey overrides it, and an error from Do's fn is always Failed.
	// Default: DefaultOutcome.
	Outcome func(status int) Outcome
}

// RetryAfterOptions are the Retry-After delays of idem's answers
// (EngineOptions.RetryAfter).
type RetryAfterOptions struct {
	// InFlight is the Retry-After of 409 request-in-flight (Do:
	// InFlightError.RetryAfter), within 1 s and the lease left. Default: 1 s.
	InFlight time.Duration

	// Store is the Retry-After of 503 store-unavailable and 503 overloaded.
	// Default: 1 s.
	Store time.Duration
}

// WaitOptions lets a duplicate that finds its request in flight wait for
// the owner's outcome (EngineOptions.Waiting; docs/contract.md "Waiting for
// the owner").
type WaitOptions struct {
	// Wait is how long a duplicate that finds its request in flight waits for
	// the owner's outcome, holding no connection, to get the owner's answer
	// (a replay) instead of 409 request-in-flight; 409 once it runs out
	// (docs/contract.md "Waiting for the owner"). A request's Prefer: wait=N
	// (RFC 7240 section 4.3: N seconds, 0 for none; the first wait preference
	// counts) or DoParams.Wait asks for another wait, capped at Max. Default:
	// 0, 409 at once.
	Wait time.Duration

	// Max bounds the wait a request asks for. Default: Wait.
	Max time.Duration

	// MaxWaiters bounds the duplicates waiting at once in this process; the
	// next one is answered 409. Each holds its request body. Default: 1000.
	MaxWaiters int

	// Poll is how often a waiter reads its key's record when the store
	// sends no notifications (idemdriver.Notifier: MariaDB, SQLite,
	// PostgreSQL behind a transaction pooler, docs/deployment.md); ten times
	// less often where it does. Default: 100 ms.
	Poll time.Duration
}

// OneCommitOptions selects the one-commit mode (EngineOptions.OneCommit).
type OneCommitOptions struct {
	// Enabled selects the one-commit mode (CONTRACT section 6): claim, writes
	// and completion commit together, so only for side effects in the store's
	// database; the Store must implement idemdriver.TxClaimer. Default: false.
	Enabled bool

	// Wait bounds a one-commit request's wait for a running key before
	// 409; on PostgreSQL it is also the lock_timeout (SQLSTATE 55P03). SQLite
	// does not use it (idemsqlite.BusyTimeout). Only with Enabled (NewEngineWith
	// refuses it otherwise). Default: 2 s.
	Wait time.Duration
}

// SealingOptions seals what records keep and hashes their keys
// (EngineOptions.Sealing; package seal, docs/sealing.md).
type SealingOptions struct {
	// Keys seal what a record keeps of a response (its headers and body,
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
	Keys []seal.Key

	// ReplayPlain lets an engine with Keys replay a SUCCEEDED record
	// stored plain (its seal_key empty), as every record written before
	// Keys were set is. Without it such a record is answered 500
	// seal-broken (Do: ErrSealBroken), logged, and never run again: whoever
	// can write idem_keys but holds no sealing key cannot plant a response
	// (a plain body under an emptied seal_key) for a sealed server to replay.
	// Set it only while switching a table that holds plain records to
	// sealing, and remove it once every plain record has expired (Retention,
	// plus the purge's grace; docs/sealing.md): meanwhile a planted plain
	// record is replayed. Only with Keys (NewEngineWith refuses it otherwise).
	// Default: false (with Keys, sealed records only).
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
	// when Keys are set (seal.Request; `idem inspect --request` shows it).
	// It is written with the completion, so SUCCEEDED records keep it and
	// FAILED ones do not; it goes with the record (purge, release). Not
	// negative. Default: 0 (no request kept).
	KeepRequestBytes int64
}

// AdmissionOptions bounds the work an engine takes (EngineOptions.Admission).
type AdmissionOptions struct {
	// MaxInFlight bounds the executions in flight in this engine: the
	// requests (and Do calls) between the start of their claim and the
	// recording of their outcome, a wait for the owner's outcome included.
	// One more is refused before it claims, so nothing is claimed, run or
	// charged: 503 overloaded with Retry-After RetryAfter.Store (Do:
	// ErrOverloaded). A replay from the replay cache is not counted. Size it
	// from the lease, the pool and the handler's time (docs/deployment.md,
	// "Leases under load"). Not negative. Default: 0, no bound.
	MaxInFlight int
}
