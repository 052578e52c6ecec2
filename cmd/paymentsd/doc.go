// Command paymentsd is a small payments API protected by idem: a demo of
// the claim protocol in front of a handler that calls a slow payment
// provider and writes its rows in the claim's transaction.
//
// Usage:
//
//	paymentsd [--addr 127.0.0.1:8080] [--database-url URL] [--psp-latency 300ms]
//	          [--lease 30s] [--shutdown-timeout 15s] [--log-format json|text]
//
// --database-url selects the database: empty (an SQLite file paymentsd.db in
// the working directory), sqlite:PATH, file:PATH or a plain PATH (SQLite,
// through idemsqlite), or postgres://... / postgresql://... (PostgreSQL,
// through pgxpool and idempgx; search_path=SCHEMA in the URL picks the
// schema). At start-up paymentsd applies idem's migrations, then its own
// (tables payments and ledger_entries, versions in paymentsd_schema_version).
//
// # Requests
//
// Every route but GET /healthz needs "Authorization: Bearer sk_test_<merchant>",
// where the merchant is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'. The
// merchant is idem's scope: keys of different merchants never meet. The
// check runs before idem, so an unauthenticated request never reaches the
// store.
//
//	POST /v1/payments        create a payment; Idempotency-Key required;
//	                         body application/json or
//	                         application/x-www-form-urlencoded with amount
//	                         (integer minor units, 1 to 2^53), currency (ISO
//	                         4217, see Currencies), customer (1-255 chars),
//	                         description (optional, at most 1000 chars);
//	                         201 with the payment and Location
//	GET  /v1/payments/{id}   one payment of the merchant, else 404
//	GET  /v1/payments?limit=N  the newest N (default 10, at most 100):
//	                         {"data":[...],"has_more":bool}
//	GET  /v1/balance         {"merchant":..,"payments":N,"totals":{"JPY":..}}
//	GET  /healthz            200 {"status":"ok"} when the database answers
//
// A POST charges the provider first and only then asks idem for the claim's
// transaction (begun on first use), writes the payment and its ledger entry
// in it, and answers 201; idem records the response in the same
// transaction. A provider error answers 502 and a database error 500 or 503:
// idem records those as FAILED, so a retry with the same key runs again, and
// the provider is asked with the same derived key (see relayKey), so it does
// not charge twice.
//
// Errors are RFC 9457 problem details (application/problem+json); the kinds
// the demo sends are documented in README.md beside this file, idem's own
// (missing-key, key-reused, request-in-flight, ...) in idem's docs.
package main
