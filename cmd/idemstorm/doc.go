// Command idemstorm is a load and chaos tool for cmd/paymentsd: it proves,
// or disproves, exactly-once payments under duplicates, client timeouts and
// SIGKILLs.
//
// Usage:
//
//	idemstorm [flags] [-- paymentsd flags...]
//
// It sends --payments logical payments (default 1000), each as --duplicates
// concurrent copies (default 4) with the same Idempotency-Key, through the
// retrying client (idemclient: same key on every retry, full-jitter backoff,
// Retry-After capped at --max-retry-after). Some sends get a short deadline
// (--timeout-rate) or are cancelled mid-flight (--cancel-rate); the copy is
// then sent again with the same key, until it gets its 201 or --deadline
// passes. Payments are spread over --merchants merchants (default: one per
// 20 payments, at least 4), and the keys repeat from one merchant to the
// next (order-0000 exists once per merchant), so keys collide across scopes.
// Each logical payment is identifiable: its description is
// "idemstorm <run> #<index>" and its customer "cus_<index>".
//
// # Target
//
// --url URL (repeatable, or comma-separated) storms paymentsd servers that
// are already running. Otherwise idemstorm starts --servers paymentsd
// processes itself (--paymentsd-bin, or a binary built with `go build -tags
// idemfaults`, which has paymentsd's fault-injection flags, into a temporary
// directory, which needs the idem module as working directory),
// all on one --database-url (default: a new SQLite file in a temporary
// directory), on free loopback ports, with --lease (default 3s) and the
// flags after "--" (for example --crash-after-charge 0.05 or --psp-latency
// 50ms). Requests, retries included, go to a random server each.
//
// --chaos kills a random server with SIGKILL every --kill-every (on
// average) for the whole run and restarts it on the same address. A server
// that dies by itself (paymentsd's --crash-* fault injection) is restarted
// too, chaos or not.
//
// --psp-url is passed to the paymentsd it starts and read at the end
// (GET /v1/charges/stats of cmd/fakepsp): the provider must hold exactly one
// charge per logical payment.
//
// --naive starts paymentsd in its --naive mode (a Redis response cache in
// idem's place, on --redis-url), to see the double charges it lets through.
//
// # Burst
//
// --burst sends every logical payment once, all at the same moment, each
// on a connection of its own, with no retry, duplicate, short deadline or
// cancellation (--duplicates, --concurrency, --timeout-rate and
// --cancel-rate do not apply). It is issue 32's burst:
// a process that takes more executions than it can renew the leases of
// loses them to its own pool. Each payment must then be answered 201 or
// refused before its claim (503 overloaded, paymentsd --max-in-flight);
// the provider (--psp-url) must hold no charge beyond the ledger's
// payments (nothing charged without a booked payment); and with a database
// URL, a completed payment's record must be SUCCEEDED and a refused one's
// absent (nothing claimed). docs/deployment.md ("Leases under load") has
// the command and its figures.
//
// --burst with --chaos (and --psp-url) is the storm of clients that never
// retry: the payments of a killed server get no answer, and paymentsd's
// completer (started with --completer-grace 1s) must finish them. After the
// load, idemstorm waits (at most 2 minutes) until every charge the provider
// made is booked and no key is left PROCESSING, then reconciles: ledger =
// provider charges, no double charge or payment, no record PROCESSING or
// UNKNOWN; answers are not required.
//
// # Reconciliation
//
// When the storm is over, idemstorm reconciles through the API, per
// merchant: GET /v1/payments?limit=100 (every payment, when the merchant
// has no more than 100) counted by description, and GET /v1/balance (the
// ledger: payment count and totals per currency). Every logical payment must
// appear exactly once, with its amount and currency; every payment id a
// client was answered must be there; every copy of a logical payment must
// have been answered the same payment; the provider (with --psp-url) must
// have charged each once. With a database URL (--database-url), idem's
// record of each key must be SUCCEEDED and no record of the run may be
// PROCESSING past its lease (the `idem stuck` query).
//
// A merchant with more than 100 payments (a storm that doubled many) cannot
// be listed whole: its doubles are then counted from the ledger's total
// (a lower bound), and the report says "exact": false.
//
// # Output
//
// A progress bar while it runs (only when standard output is a terminal),
// then a summary table: requests, retries, 409s, replays, latency p50/p99
// per request and per logical payment, kills, double payments (ledger),
// double charges (provider), lost payments. --report PATH writes the whole
// report as JSON. The exit status is 0 when every logical payment succeeded
// exactly once, 1 on any double, lost, unanswered or stuck payment, and 2
// when the storm could not run.
package main
