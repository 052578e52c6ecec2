// Command fakepsp is a fake payment service provider for paymentsd's
// crash tests and demos: its own process, its own database, and idem in
// front of its charge endpoint, as a real provider (Stripe, Adyen) keeps
// its own idempotency keys. paymentsd --psp-url http://127.0.0.1:8090 sends
// it every charge with the key idem relays (idem.RelayKey), so a charge
// asked again after a crash, a timeout or a takeover is answered with the
// charge already made.
//
// Usage:
//
//	fakepsp [--addr 127.0.0.1:8090] [--database-url URL] [--lease 30s]
//	        [--latency 0s] [--fail-rate P] [--timeout-rate P] [--hang 1m]
//	        [--idempotency=false] [--shutdown-timeout 15s] [--log-format json|text]
//	        [--otel-traces none|stdout]
//
// --database-url takes what paymentsd's does: empty (the SQLite file
// fakepsp.db in the working directory), sqlite:PATH, file:PATH or PATH, or
// postgres://... (search_path=SCHEMA picks the schema).
//
// # Requests
//
//	POST /v1/charges        charge; "Authorization: Bearer sk_test_<merchant>"
//	                        and Idempotency-Key required; body application/json
//	                        or application/x-www-form-urlencoded with amount
//	                        (integer minor units), currency (three letters),
//	                        customer, description (optional). 201 with the
//	                        charge and Location; the same key again: idem's
//	                        replay of it (Idempotent-Replayed: true).
//	GET  /v1/charges/{id}   one of the merchant's charges, else 404
//	GET  /v1/charges/stats  distinct charges made, per merchant and in total,
//	                        no authentication (a test-mode view):
//	                        {"merchants":{"acme":{"charges":3,"amount":{"JPY":3000}}},"charges":3}
//	GET  /healthz           200 {"status":"ok"} when the database answers
//	GET  /metrics           idem's decisions in Prometheus' text format, no
//	                        authentication (docs/observability.md)
//
// A charge is written in the claim's transaction (idem.Tx[*sql.Tx] or
// idem.Tx[pgx.Tx]), so it commits together with idem's record of the 201: a
// charge exists if and only if its key replays it.
//
// # Fault injection
//
// --latency D waits D before each charge. --fail-rate P answers 503 without
// charging (idem records FAILED: the same key runs again). --timeout-rate P
// makes a new charge, records it, then holds its answer back for --hang or
// until the client hangs up: the client's "outcome unknown", which only a
// retry with the same key can resolve, and does, with the replay (replays
// are never held back).
//
// --idempotency=false turns the key handling off, as at a provider that has
// none (bank transfer files, SMS, many local providers): the charge
// endpoint runs without idem, the key is optional and ignored, and every
// call charges anew, a retry after a timeout included. It is the callee an
// at-most-once step is for (docs/contract.md section 11).
package main
