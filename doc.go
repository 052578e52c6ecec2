// Package idem gives HTTP APIs exactly-once side effects for retried POST and
// PATCH requests, keyed by the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header) and decided by a relational
// database: PostgreSQL (idempgx), MySQL / MariaDB (idemmysql) or SQLite
// (idemsqlite). Unlike a response cache, it gives one worker at a time the
// ownership of an execution, decided in one atomic statement, and records the
// outcome durably, with the business writes when the handler uses the claim's
// transaction.
//
// # Using it
//
//	store, _ := idemsqlite.Open(ctx, "idem.db") // or idempgx.New(pool)
//	_ = store.Migrate(ctx)
//	mw, _ := idem.NewMiddleware(store, idem.Options{Scope: merchantFromAuth})
//	mux.Handle("POST /v1/payments", mw.Handler(createPayment))
//
// Wrap routes, not the router: idem records the 404 of a mistyped path, and
// the corrected request with the same key gets 422. Size the pool above the
// handlers holding a claim's transaction at once: heartbeats need a
// connection of their own, and a lease without one is given up (503).
//
// # The request
//
// A protected request (POST or PATCH by default) carries its key as an RFC
// 8941 sf-string ("abc") or bare (abc): 1 to 255 visible ASCII characters.
// Options.Scope names the key's owner (a tenant, an account); it is required.
// The method, path, query, media type and body (at most Options.Request.MaxBytes, JSON
// canonicalized per RFC 8785) make a SHA-256 fingerprint.
//
// # The state machine
//
// Each (scope, key) has one record (CONTRACT section 3). With no record, or
// one past Retention, the claim inserts PROCESSING with a new fencing token
// and a lease (database now + EngineOptions.Lease.Duration), and the handler runs. PROCESSING
// under a live lease answers 409 request-in-flight with Retry-After.
// PROCESSING past its lease is taken over with the next fencing token and the
// handler runs again, so downstream calls carry RelayKey (CONTRACT section 7).
// SUCCEEDED replays the stored response with Idempotent-Replayed: true.
// FAILED (5xx, 408, 425, 429, a panic) is claimed again. A request whose
// method, path or fingerprint differs from the record's gets 422 key-reused.
//
// # Leases and fencing
//
// Leases use the database's clock and are renewed every Lease.Duration/3.
// Renewal, completion and release compare-and-set on the fencing token, so a
// worker that lost its lease cannot overwrite the new owner's record; its
// context is cancelled with cause ErrLeaseLost (409), or with a *StoreError
// after a whole lease without a renewal (503). The handler's context is
// detached from the client's: a hang-up does not stop the work.
//
// # Outcomes and transactions
//
// The response is held until its outcome is recorded. By DefaultOutcome, 2xx
// and most 4xx are SUCCEEDED and replayed; 5xx, 408, 425 and 429 are FAILED.
// ReleaseKey, or an Outcome returning Released, records nothing. Writes
// through the claim's transaction commit with the completion:
//
//	tx, err := idem.Tx[pgx.Tx](r.Context())
//
// # Errors
//
// idem's own answers are RFC 9457 problems of type ProblemTypeBase + kind
// (docs/problems.md), reshaped by Options.ProblemWriter if set. An unreachable
// store answers 503 store-unavailable; the handler never runs unprotected.
// Answers from a record carry HeaderKeyExpires.
//
// # Beyond HTTP
//
// Engine.Do runs the protocol for a consumer or a job (examples/natsconsumer):
//
//	engine, _ := idem.NewEngineWith(store, idem.EngineOptions{})
//	res, err := engine.Do(ctx, idem.DoParams{Scope: "orders", Key: msgID, Payload: data},
//		func(ctx context.Context) (idem.Result, error) {
//			tx, _ := idem.Tx[*sql.Tx](ctx) // committed with the outcome
//			_, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", msgID)
//			return idem.Result{Status: 200}, err
//		})
//
// # Observing it
//
// Options.Engine.Observer receives one Event per decision (docs/observability.md).
package idem
