// Command paymentsd is a small payments API protected by idem: a demo of
// the claim protocol in front of a handler that calls a slow payment
// provider and writes its rows in the claim's transaction.
//
// Usage:
//
//	paymentsd [--addr 127.0.0.1:8080] [--database-url URL]
//	          [--psp-url URL] [--psp-timeout 5s] [--psp-latency 300ms]
//	          [--relay-secret S] [--lease 30s] [--write-mode claim|separate]
//	          [--wait 0s] [--max-wait 10s] [--max-in-flight 0]
//	          [--seal-key ID:SECRET [--seal-replay-plain]] [--key-hash-secret S]
//	          [--keep-request-bytes 0] [--at-most-once-charge]
//	          [--completer=true] [--completer-grace 10s]
//	          [--shutdown-timeout 15s] [--log-format json|text]
//	          [--otel-traces none|stdout]
//	          [--crash-<point> P] [--stall-after-charge D]   (-tags idemfaults)
//	          [--naive [--redis-url URL] [--naive-ttl 24h]]
//
// --database-url selects the database: empty (an SQLite file paymentsd.db in
// the working directory), sqlite:PATH, file:PATH or a plain PATH (SQLite,
// through idemsqlite), postgres://... / postgresql://... (PostgreSQL,
// through pgxpool and idempgx; search_path=SCHEMA in the URL picks the
// schema; behind pgbouncer add idem_pooler=transaction and
// idem_schema=SCHEMA, docs/deployment.md), or mysql://user:password@host:port/dbname (MySQL or MariaDB,
// through idemmysql.Open). At start-up paymentsd applies idem's migrations,
// then its own (tables payments and ledger_entries, versions in
// paymentsd_schema_version).
//
// # Requests
//
// Every route but GET /healthz and GET /metrics needs "Authorization: Bearer sk_test_<merchant>",
// where the merchant is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'. The
// merchant is idem's scope: keys of different merchants never meet. The
// check runs before idem, so an unauthenticated request never reaches the
// store.
//
//	POST /v1/payments        create a payment; Idempotency-Key required;
//	                         body application/json or
//	                         application/x-www-form-urlencoded with amount
//	                         (integer minor units, 1 to 2^53; in JSON any
//	                         spelling of an integer: 1000, 1000.0, 1e3), currency (ISO
//	                         4217, see Currencies), customer (1-255 chars),
//	                         description (optional, at most 1000 chars);
//	                         201 with the payment and Location
//	GET  /v1/payments/{id}   one payment of the merchant, else 404
//	GET  /v1/payments?limit=N  the newest N (default 10, at most 100):
//	                         {"data":[...],"has_more":bool}
//	GET  /v1/balance         {"merchant":..,"payments":N,"totals":{"JPY":..}},
//	                         each total the exact sum (a JSON number past
//	                         2^63 if need be)
//	GET  /healthz            200 {"status":"ok"} when the database answers a
//	                         read of idem's table and the payments table
//	                         and, on SQLite, the file at the path is the one
//	                         open (not deleted or replaced); else 503
//	GET  /metrics            idem's decisions in Prometheus' text format
//	                         (docs/observability.md); --otel-traces stdout
//	                         also writes each request's spans to stdout
//
// Only POST /v1/payments goes through idem: a key sent to another route or
// with another method gets its 404 or 405 without a record. The reads
// answer 503 with Retry-After when the database fails.
//
// A POST charges the provider first and only then asks idem for the claim's
// transaction (begun on first use), writes the payment and its ledger entry
// in it, and answers 201; idem records the response in the same
// transaction. A provider error answers 502, a provider timeout 504 and a
// database error 500 or 503: idem records those as FAILED, so a retry with
// the same key runs again, and the provider is asked with the same relayed
// key (idem.RelayKey(ctx, "charge"), keyed by --relay-secret or
// $PAYMENTSD_RELAY_SECRET), so it does not charge twice.
//
// # The provider
//
// Without --psp-url the provider is an in-process fake (--psp-latency per
// charge). With --psp-url it is an HTTP service such as cmd/fakepsp:
// POST {psp-url}/v1/charges, "Authorization: Bearer sk_test_<merchant>",
// Idempotency-Key: the relayed key; --psp-timeout bounds each charge.
//
// # Fault injection
//
// Only a binary built with the tag idemfaults (go build -tags idemfaults
// ./cmd/paymentsd; e2e and cmd/idemstorm build it so) has these flags; a
// normal build carries no fault injection at all.
//
// --crash-<point> P kills the process with SIGKILL, with probability P, when
// a POST /v1/payments reaches point: before-claim, before-charge,
// in-charge, after-charge, after-write, after-commit or on-replay.
// --stall-after-charge D pauses a request and the process's lease renewal
// for D after each charge: a slow owner that resumes after its lease
// expired. --write-mode separate commits the payment's rows before idem
// records the outcome, for comparison with the default (claim).
// docs/crash-semantics.md describes what each crash does to the client and
// the ledger, and how to reproduce them by hand.
//
// --naive, for comparison only, replaces idem with the common Redis response
// cache (GET the key, else run and SET the response; no lock) on the Redis
// server of --redis-url, keeping responses for --naive-ttl; it double-charges
// concurrent retries, which cmd/idemstorm measures (naive.go lists its
// failure modes).
//
// Errors are RFC 9457 problem details (application/problem+json); the kinds
// the demo sends are documented in README.md beside this file, idem's own
// (missing-key, key-reused, request-in-flight, ...) in idem's docs.
package main
