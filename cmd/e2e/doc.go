// Package e2e holds the end-to-end tests of crash safety and key relay
// (docs/crash-semantics.md): they build cmd/paymentsd and cmd/fakepsp, run
// them as real processes against SQLite files, PostgreSQL schemas and
// MySQL/MariaDB databases, kill them with SIGKILL (or let them kill
// themselves at a chosen crash point), restart them, and count charges at
// the provider and payments in the ledger.
//
// The PostgreSQL tests need TEST_DATABASE_URL, the MySQL/MariaDB tests
// TEST_MYSQL_URL (scripts/test sets both); without them they skip, or fail
// under CI (internal/dbtest). When the tests run with -race, the binaries
// are built with -race too, and a data race reported by any child process
// fails its test. E2E_LOG_DIR=DIR keeps every process's output in DIR.
package e2e
