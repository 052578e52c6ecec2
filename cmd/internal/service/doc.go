// Package service is the plumbing that idem's demo services, cmd/paymentsd
// and cmd/fakepsp, share; each command keeps its own flags, schema and
// handlers.
//
//   - The database (Open, DB): the --database-url opened by dburl.Open as
//     idem's driver (idempgx, idemmysql or idemsqlite) plus a handle for the
//     service's own queries, migrated first with idem's migrations and then
//     with the service's goose migrations (Schema), recorded in its own
//     version table; DB.CheckFile notices a SQLite file deleted under it.
//   - Exact sums (SumColumns, JoinSum): totals of amounts past 2^63.
//   - The API key (API.Authenticate, Merchant, Scope): "Authorization: Bearer
//     sk_test_<merchant>", where the merchant is idem's scope, and the 401
//     problem when it is missing or invalid.
//   - Answers (API.WriteJSON, API.Problem, API.WriteProblem): JSON bodies and
//     RFC 9457 problem details whose type URIs point into the service's
//     README.
//   - The request log (LogRequests): one slog line per request.
//   - The process (NewLogger, Server, CloseDatabase): the --log-format logger,
//     and serving until SIGINT/SIGTERM, then a clean shutdown.
//
// A service's handler is wired as
//
//	LogRequests
//	  GET /healthz (no authentication)
//	  everything else: API.Authenticate -> routes, idem wrapping only the
//	  routes with a side effect (never the router: a mistyped path's 404
//	  would use the key up)
package service
