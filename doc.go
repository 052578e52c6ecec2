// Package idem gives HTTP APIs exactly-once side effects for retried POST
// and PATCH requests, keyed by the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header) and decided by a relational
// database: PostgreSQL (idempgx), MySQL / MariaDB (idemmysql) or embedded
// SQLite (idemsqlite).
//
// Idempotency is not response caching. A cache written after the handler
// runs lets a retry that arrives while the first request is still running
// run the payment again. idem instead gives one worker at a time the
// ownership of an execution, decided by the database in one atomic
// statement, and records the outcome durably, in the same transaction as the
// business writes when the handler uses that transaction.
//
// # Using it
//
// Create a driver, migrate it, and wrap the handlers that have side effects:
//
//	store, _ := idemsqlite.Open(ctx, "idem.db") // or idempgx.New(pool)
//	_ = store.Migrate(ctx)
//	mw, _ := idem.New(idem.Config{Store: store, Scope: merchantFromAuth})
//	mux.Handle("POST /v1/payments", mw.Handler(createPayment))
//	http.ListenAndServe(addr, authenticate(mux))
//
// Middleware.Handler is a func(http.Handler) http.Handler, so it drops into
// net/http, chi, gorilla/mux and anything else that speaks http.Handler.
// Wrap routes, not the router: around a whole router, idem records the 404
// of a mistyped path (a 4xx is an outcome) and the corrected request with
// the same key gets 422.
//
// Size the database pool for more connections than protected handlers that
// hold the claim's transaction at once: the lease heartbeat, and the
// completion of handlers that use no transaction, take a connection of
// their own while a transaction holds one. A pool that runs dry leaves
// heartbeats waiting, and after a whole lease without one idem gives the
// execution up (503) although the database is healthy.
//
// # The request
//
// A protected request (POST or PATCH by default) carries its key as an RFC
// 8941 sf-string ("abc") or bare (abc): 1 to 255 visible ASCII characters,
// sent once. The Scope function names who owns the key (a tenant, an
// account), so keys of different scopes never meet. It is required: an API
// with one owner of every key says so with SingleTenant. The body, at most
// MaxRequestBytes, is hashed into a SHA-256 fingerprint together with the
// method, the path, the canonical query and the media type; JSON is
// canonicalized first (RFC 8785), so key order and whitespace do not matter.
//
// # The state machine
//
// Each (scope, key) has one record in one of three states.
//
// No record, or an expired one (older than Retention, purged or not): the
// claim inserts a PROCESSING record with a new fencing token and a lease,
// locked_until = database now + LeaseDuration, and the handler runs. (An
// expired record whose execution is unfinished is the exception: a live
// lease still answers 409, and the same request retried continues it; see
// docs/contract.md section 3.)
//
// PROCESSING under a live lease: another worker owns the key. The answer is
// 409 with the problem type request-in-flight and Retry-After set to the
// in-flight delay (Config.InFlightRetryAfter, 1 s by default), never more
// than the lease left. The handler does not run.
//
// PROCESSING past its lease: the owner died or stalled. The claim takes the
// record over with the next fencing token and a new lease, and the handler
// runs again. Downstream calls should carry a key derived from the scope and
// key (CONTRACT section 7) so that the provider recognizes the re-execution.
//
// SUCCEEDED: the stored response (status, allow-listed headers and
// trailers, body) is replayed byte for byte with Idempotent-Replayed: true.
// A SUCCEEDED record without its response (damaged) answers 500
// response-missing.
//
// FAILED: the last run ended with a retryable outcome (5xx, 408, 425, 429, a
// panic); the claim takes the record again and the handler runs.
//
// In every state, a request whose method, path or fingerprint differs from
// the record's is answered 422 with the problem type key-reused.
//
// Exactly one of any number of concurrent claimants wins a claim, a takeover
// or a re-claim; the others get the answer of the row they lost to.
//
// # Leases and fencing
//
// Every lease comparison uses the database's clock. While the handler runs,
// the lease is renewed every LeaseDuration/3; a renewal, the completion and
// the release are all compare-and-set on the fencing token, so a worker that
// lost its lease cannot overwrite the new owner's record. When a renewal
// finds the lease lost, the handler's context is cancelled with cause
// ErrLeaseLost (the caller gets 409); when no renewal reaches the store for
// a whole lease, with a *StoreError (the caller gets 503). On a
// single-writer store (SQLite) the lease is not renewed while the handler's
// business transaction holds the write lock: nobody can claim meanwhile.
// The handler's context is detached from the client's: a client that hangs
// up does not stop the work or its recording.
//
// # Outcomes and transactions
//
// The response is held until the outcome is recorded, so no caller sees a
// success that was not recorded. By DefaultOutcome, 2xx and 4xx other than
// 408, 425 and 429 are SUCCEEDED and replayed; the rest are FAILED and run
// again. A handler that calls ReleaseKey (a validation failure, before any
// side effect), or an Outcome policy that says Released
// (ReleaseValidationFailures), records nothing: the record is removed and
// the corrected request runs. A handler that writes through the claim's
// transaction (idem.Tx: pgx.Tx or *sql.Tx) gets its writes and
// the completion committed together; when the completion is fenced out,
// both roll back and the caller gets 409. When a statement of the handler
// aborted the transaction (PostgreSQL), its writes are gone: an error the
// handler answered is recorded on its own, and a 2xx is answered 500
// transaction-aborted and recorded FAILED.
//
// An outcome is recorded only while its execution's lease is live, at most
// MaxExecution + LeaseDuration after the claim, and New refuses a Retention
// shorter than that: a completed execution is always replayed, however long
// its handler ran.
//
// # Errors
//
// Every answer idem makes itself is RFC 9457 problem details with a stable
// type URI (ProblemTypeBase + kind); docs/problems.md documents each kind.
// When the store cannot be reached the answer is 503 store-unavailable with
// Retry-After, and the handler never runs unprotected. Config.ProblemWriter
// lets an API answer them in its own error format instead.
//
// Every answer to a request that reached the claim echoes its
// Idempotency-Key as sent and, while a record holds the key, advertises
// when the key expires in the Idempotency-Key-Expires header
// (HeaderKeyExpires, an RFC 9110 HTTP-date).
//
// # Beyond HTTP
//
// Engine.Do runs the same protocol (claim, lease, heartbeat, fencing,
// outcome policy, replay, the claim's transaction) for work that is not an
// HTTP request: a message consumer, a webhook, a job. The caller names the
// scope and key (a stream and a message id) and gets the recorded Result,
// or an error to branch on (ErrInFlight, ErrKeyReused, ErrStoreUnavailable,
// ErrReleased, ...). The middleware is one user of that engine;
// examples/natsconsumer is another, for NATS JetStream:
//
//	engine, _ := idem.NewEngine(idem.EngineConfig{Store: store})
//	res, err := engine.Do(ctx, idem.DoParams{Scope: "orders", Key: msgID, Payload: data},
//		func(ctx context.Context) (idem.Result, error) {
//			tx, _ := idem.Tx[*sql.Tx](ctx) // committed with the outcome
//			...
//		})
//
// # Observing it
//
// Config.Observer receives one Event per decision (executed, replayed, in
// flight, key reused, released, taken over, lease lost, store unavailable,
// completion failed) with its route, attempt, status and durations; every
// log call carries the request's context. docs/observability.md lists the
// events and their fields.
package idem
