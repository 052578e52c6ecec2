// Package idemdriver is the seam between idem's core and a database.
//
// Stability: this package is for driver authors and for idem's own core. Its
// contract (Driver, the optional interfaces and their params structs) may
// gain methods and fields between minor versions while idem is below 1.0;
// applications use the core (package idem) and a driver package (idempgx,
// idemmysql, idemsqlite), never this package's values directly. Every method
// takes a params struct, so a new input is a new field, not a new signature.
//
// What is here: the contract (Driver, Tx, the records and params, the one
// decision table Decide) and the optional interfaces of retention and
// operations (retention.go, onecommit.go), of renewing many leases in
// one statement (Renewer, renew.go), of the wait mode's mark (WaitMarker,
// notify.go) and of an execution's steps (Stepper, steps.go). What the SQL drivers write alike
// (the stored response's columns, the claim's SQL shapes, SQLTx) is in
// package idemdriver/idemsql. The core hands the business transaction to
// the handler itself (idem.Tx); nothing here reaches back into it.
//
// The core (package idem) decides what an HTTP request gets from the record a
// driver returns; a driver owns its SQL, its embedded migrations and the
// mapping of its database's error codes. The core never imports a concrete
// driver and a driver never imports the core: both import this package.
//
// Every method that reads or compares time uses the database's clock. The
// ClockOffset field of each parameter struct moves that clock: the driver adds
// it to the database's "now" in the statement itself. Production code leaves
// it at zero; tests move time forward with it instead of sleeping.
//
// A new database is "make the conformance suite pass": see package
// idemdriver/idemdrivertest.
package idemdriver

import (
	"context"
	"errors"
	"time"
)

// State is the state of one execution record, per CONTRACT section 3.
type State string

const (
	// StateProcessing: a worker owns the record until LockedUntil.
	StateProcessing State = "PROCESSING"
	// StateSucceeded: the outcome is final and the stored response is replayed.
	StateSucceeded State = "SUCCEEDED"
	// StateFailed: the last execution ended with a retryable outcome; the next
	// request with the same key claims the record again.
	StateFailed State = "FAILED"
	// StateUnknown: an at-most-once step started and its outcome cannot be
	// known (CONTRACT section 11.3). Never claimed, taken over, purged or
	// dropped; ended by Stepper.ResolveStep.
	StateUnknown State = "UNKNOWN"
)

// ErrNotFound is returned by Driver.Get when no record exists for (scope, key).
var ErrNotFound = errors.New("idemdriver: record not found")

// ErrUnstorable is wrapped by the error a driver returns for a scope, key,
// path or owner that its database cannot store or compare: a NUL byte or
// invalid UTF-8 in a PostgreSQL text column (SQLSTATE 22021 or 22P05), or a
// value longer than its column (idemmysql.ErrTooLong wraps it too). Nothing
// was written. It is a server fault, not an outage: running the same request
// again meets the same refusal, so the core answers 500 once instead of the
// 503 that invites retries. Drivers whose columns hold any
// bytes (MySQL's VARBINARY, SQLite's TEXT) store such values as sent and
// never return it for them.
var ErrUnstorable = errors.New("idemdriver: the database cannot store this scope, key, path or owner")

// ErrBusy is wrapped by the error of a write that waited for a
// single-writer database's write lock (SingleWriter: SQLite) until its
// context ended, because another transaction held it: the write was queued,
// not refused, and the database is healthy. While that lock is held no claim
// can take any key over either (a takeover is a write), so the core does not
// count a Heartbeat that fails with ErrBusy against the lease.
var ErrBusy = errors.New("idemdriver: the database's write lock is held by another transaction")

// MaxOwnerBytes is the longest ClaimParams.Owner every driver stores.
const MaxOwnerBytes = 255

// ClaimParams are the inputs of the one atomic claim statement.
type ClaimParams struct {
	Scope string // tenant / account / principal owning the key, at most 255 bytes
	Key   string // the Idempotency-Key value, unquoted, 1-255 visible ASCII
	// Method and Path are the request's method and route path; together with
	// Fingerprint they must match the stored record for a replay.
	Method string
	Path   string
	// Fingerprint is the request's SHA-256 fingerprint (32 bytes).
	Fingerprint []byte
	// LeaseDuration sets locked_until = database now + LeaseDuration on a claim.
	LeaseDuration time.Duration
	// Retention sets expires_at = database now + Retention on a new record.
	Retention time.Duration
	// Owner names who claims: an instance id such as "host/pid" or a
	// configured name, at most MaxOwnerBytes bytes; empty when unknown. Every
	// claim stores it in the record's owner column (Record.Owner), so an
	// operator listing stuck executions (Inspector.Stuck) can tell whose
	// worker died. It takes no part in any decision.
	Owner string
	// ClockOffset is added to the database's clock (tests only; zero in production).
	ClockOffset time.Duration
}

// GetParams name the record Driver.Get reads.
type GetParams struct {
	Scope string
	Key   string
	// ClockOffset is added to the database's clock when LeaseLeft is
	// measured (tests only; zero in production).
	ClockOffset time.Duration
}

// ClaimResult is what the claim statement decided.
type ClaimResult struct {
	// Claimed is true when this call won the record: a new record, an expired
	// one, a takeover of a PROCESSING record whose lease expired, or a re-claim
	// of a FAILED record. The caller owns the execution under Record.FencingToken.
	Claimed bool
	// TookOver is true when the claim took over a PROCESSING record whose
	// lease had run out (idemdriver.DecisionTakeOver: its worker died or
	// stalled, so the execution that follows is a re-execution whose side
	// effects may already have reached a provider once). False for every
	// other decision, a re-claim of FAILED included. The core reports it to
	// Config.Observer; it takes no part in the protocol.
	TookOver bool
	// Record is the record as stored after the statement: the caller's own
	// claim when Claimed, otherwise the row it lost to.
	Record Record
}

// Record is one stored execution, per CONTRACT section 9.
type Record struct {
	Scope        string
	Key          string
	Method       string
	Path         string
	Fingerprint  []byte
	State        State
	FencingToken int64
	// Owner is ClaimParams.Owner of the latest claim ("" for records written
	// before the owner column existed).
	Owner string
	// LeaseLeft is locked_until minus the database's now (ClockOffset
	// included); zero or negative when the lease has run out or the record is
	// not PROCESSING.
	LeaseLeft time.Duration
	// Response is the stored response of a SUCCEEDED record; nil otherwise.
	Response    *Response
	Attempts    int
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
	ExpiresAt   time.Time
	LockedUntil *time.Time
}

// Response is a stored response: what a replay sends back.
//
// A sealed response (SealKey not "", idem.EngineOptions.Sealing.Keys) carries its
// headers and body in Sealed, an opaque blob (package seal), and its Header
// and Body are nil; Status, BodyStored and BodySize stay plain, and SealTag
// authenticates them. A driver stores Sealed, SealKey, SealTag and Request
// as given and returns them unchanged; it never reads them.
type Response struct {
	Status int
	// Header holds the allow-listed response headers (nil when sealed).
	Header map[string][]string
	// Body is the byte-exact response body (nil when sealed). When BodyStored
	// is false the body was larger than the configured maximum and was not
	// kept; BodySize still says how large it was.
	Body       []byte
	BodyStored bool
	BodySize   int64
	// SealKey is the id of the key that sealed Sealed and Request, at most
	// MaxSealKeyBytes bytes; "" for a plain response (and for every record
	// written before sealing existed).
	SealKey string
	// Sealed is the sealed headers and body when SealKey is set; nil
	// otherwise. A driver whose database cannot hold it (idemmysql, past
	// max_allowed_packet) may drop it with the body (BodyStored false).
	Sealed []byte
	// SealTag authenticates, under SealKey, the plain columns of a sealed
	// response (Status, BodyStored, BodySize) and whether Sealed is kept,
	// bound to the record's life (package seal); nil for a plain response
	// and for a record sealed before seal tags. At most MaxSealTagBytes. A
	// driver stores it as given, in a column of its own apart from the
	// blob (it is kept when the blob is dropped), returns it unchanged, and
	// never reads it; every claim clears it with the response.
	SealTag []byte
	// SealTagDropped is the seal tag of this response stored without its
	// blob (Sealed dropped, BodyStored false). A driver that drops Sealed
	// (idemmysql, past max_allowed_packet) stores it in SealTag's place,
	// so the record opens as one whose body was not stored; any other
	// write ignores it, and no read returns it.
	SealTagDropped []byte
	// Request is the kept request (idem.EngineOptions.Sealing.KeepRequestBytes), as
	// seal.EncodeRequest packs it, sealed under SealKey when that is set;
	// nil when none was kept. It is written by Complete (and a Tx's) with the
	// response and read back by Get and Lister.List; Claim and
	// Inspector.Stuck need not read it (a replay does not send it). It is a
	// column of the record: a purge or a release removes it with the record.
	Request []byte
}

// MaxSealKeyBytes is the longest Response.SealKey every driver stores.
const MaxSealKeyBytes = 64

// MaxSealTagBytes is the longest Response.SealTag every driver stores (a
// tag is 33 bytes: a format byte and an HMAC-SHA256).
const MaxSealTagBytes = 64

// FenceParams name one owned execution: every write after the claim is a
// compare-and-set on (Scope, Key, FencingToken, CreatedAt) with state
// PROCESSING.
type FenceParams struct {
	Scope        string
	Key          string
	FencingToken int64
	// CreatedAt is the claimed record's created_at (Record.CreatedAt, as the
	// claim returned it). A purged key starts again at fencing token 1, so
	// the token alone could match a later record of the same key; the
	// record's created_at tells the two lives apart.
	CreatedAt time.Time
	// LeaseDuration is the new lease length for Heartbeat; unused elsewhere.
	LeaseDuration time.Duration
	ClockOffset   time.Duration
	// Notify, when not empty, is the payload of the notification a Notifier
	// sends on its channel when Complete, Fail or Release (in Tx too) takes
	// effect: at the commit of the transaction it runs in, and only when it
	// wrote. At most 64 bytes of hex. Drivers that do not notify ignore it.
	Notify string
	// NotifyMarked, with Notify, sends the notification only when a waiter
	// marked the record (WaitMarker.MarkWaited) before the write took
	// effect, so that an execution nobody waits for costs its commit
	// nothing more. The core sets it in durable-claim mode on a WaitMarker;
	// never in one-commit mode, whose owner holds the record's row lock
	// while it runs, so that no waiter can mark it. Drivers that do not
	// implement WaitMarker ignore it and notify as Notify says.
	NotifyMarked bool
}

// CompleteParams record a SUCCEEDED outcome.
type CompleteParams struct {
	FenceParams
	Response Response
}

// Driver is one database's implementation of the claim protocol. All methods
// are safe for concurrent use. Errors other than ErrNotFound and
// ErrUnstorable mean the store could not answer; the core answers 503 and
// never runs a handler unprotected.
// Deadlocks, serialization failures and lost races are resolved inside the
// driver (retried or answered from the winning row), never returned.
type Driver interface {
	// Claim runs the atomic claim of CONTRACT section 3 for (Scope, Key)
	// (Decide states it for a record read, row by row):
	//   - no record: write a new PROCESSING record (attempts 1, created_at
	//     now), Claimed;
	//   - PROCESSING with locked_until > now (a live lease), expired or not:
	//     return the record, not Claimed;
	//   - the same method, path and fingerprint, FAILED or PROCESSING past
	//     its lease, expired or not: PROCESSING again, attempts+1, created_at
	//     kept (the record's life continues), Claimed;
	//   - otherwise expired (expires_at <= now): PROCESSING, attempts 1,
	//     created_at now (a new life), Claimed;
	//   - otherwise (SUCCEEDED, or another request's key): return the record,
	//     not Claimed.
	// Each claim sets locked_until = now+LeaseDuration, expires_at =
	// now+Retention, and a fencing token greater than any earlier one for
	// (Scope, Key), expired records included.
	// Exactly one of any number of concurrent callers is Claimed.
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Heartbeat extends the lease to now+LeaseDuration if the caller still
	// owns the record (same fencing token, PROCESSING). It reports false when
	// ownership was lost.
	Heartbeat(ctx context.Context, p FenceParams) (bool, error)

	// Complete records SUCCEEDED with the response, fenced by the token. It
	// reports false, writing nothing, when the caller no longer owns the record.
	Complete(ctx context.Context, p CompleteParams) (bool, error)

	// Fail records FAILED (retryable) and clears the lease, fenced by the
	// token. It reports false when the caller no longer owns the record.
	Fail(ctx context.Context, p FenceParams) (bool, error)

	// Release removes the record of this execution, fenced like Complete and
	// Fail (scope, key, fencing token, created_at, PROCESSING), so that the
	// next request with the key runs as new: for an answer that must not be
	// recorded, such as a validation failure the client will correct. It
	// reports false, removing nothing, when the caller no longer owns the
	// record. FenceParams.LeaseDuration is unused.
	Release(ctx context.Context, p FenceParams) (bool, error)

	// Begin starts a business transaction on the store's database. The
	// handler does its writes in it, and the completion is written in it.
	Begin(ctx context.Context) (Tx, error)

	// Get reads the record for (p.Scope, p.Key) without changing it, or
	// returns ErrNotFound. LeaseLeft is measured against the database's
	// clock plus p.ClockOffset.
	Get(ctx context.Context, p GetParams) (Record, error)

	// Migrate applies the driver's embedded schema migrations (idempotent).
	Migrate(ctx context.Context) error
}

// SingleWriter is implemented by drivers whose database has one writer at a
// time (SQLite). While a claim's business transaction is open it holds that
// write lock, so no other claim can take the key over, and the core does not
// renew the lease (a renewal would wait behind the transaction itself).
type SingleWriter interface {
	SingleWriter() bool
}

// Tx is a business transaction in which the completion rides. Unlike the
// Driver's own statements, its Complete cannot be retried after a deadlock
// or serialization failure: the database has already aborted the whole
// transaction, business writes included. Such an error reaches the core,
// which rolls back, records FAILED (fenced) when nothing committed, and
// answers 503: the retry runs again. In the one-commit mode (TxClaimer), an
// error of Complete or Commit that wraps ErrConflict is answered from the
// key's record read again instead (a replay, or 409).
type Tx interface {
	// Complete is Driver.Complete inside this transaction. When it reports
	// false the caller must Rollback: the business writes must not commit.
	Complete(ctx context.Context, p CompleteParams) (bool, error)
	// Commit commits the business writes and the completion together.
	Commit(ctx context.Context) error
	// Rollback aborts the transaction; calling it after Commit is a no-op.
	Rollback(ctx context.Context) error
	// Native returns the driver's transaction value (pgx.Tx, *sql.Tx, ...).
	Native() any
}

// CompleteCommitter is implemented by a Tx that can send its completion and
// its COMMIT together, in one round trip (idempgx: a pipeline of the two
// statements); the core then calls CompleteCommit instead of Complete and
// Commit. The COMMIT must depend on the completion: a completion fenced out
// (the record is no longer this execution's) or failed must leave the
// business writes uncommitted, whatever was sent after it.
type CompleteCommitter interface {
	// CompleteCommit is Complete followed, when the completion holds, by
	// Commit. It reports false when the completion was fenced out, and
	// returns Complete's errors (ErrTxDone and ErrTxAborted wrapped as
	// Complete wraps them) when the database refused the completion: in
	// both cases nothing was committed and the caller must Rollback (the
	// core does, even when it has stopped waiting for the call). An error
	// of the COMMIT itself, or one after which the driver cannot tell
	// whether the COMMIT ran (the connection lost once both were sent),
	// wraps ErrCommit: the transaction is over, and whether its writes took
	// effect is unknown.
	CompleteCommit(ctx context.Context, p CompleteParams) (bool, error)
}

// ErrCommit is wrapped by CompleteCommitter.CompleteCommit when the
// completion was written but the COMMIT sent with it failed.
var ErrCommit = errors.New("idemdriver: the commit of the business transaction failed")
