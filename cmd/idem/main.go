// Command idem operates an idem store: its schema migrations, the retention
// of its records, and what an operator on call needs to see without writing
// SQL.
//
//	idem --database-url URL migrate up|down|status [--partitioned]
//	idem --database-url URL purge [--older-than D] [--batch N] [--max-batches M] [--dry-run]
//	idem --database-url URL partitions ensure [--days-ahead N] | drop [--older-than D] [--dry-run] | list
//	idem --database-url URL inspect --key K [--scope S] [--body]
//	idem --database-url URL list [--state FAILED|PROCESSING|SUCCEEDED] [--scope S] [--limit N] [--after-scope S --after-key K]
//	idem --database-url URL release --scope S --key K [--force]
//	idem --database-url URL stuck [--limit N]
//	idem --database-url URL stats [--top N]
//
// The database comes from --database-url or IDEM_DATABASE_URL:
// postgres:// or postgresql:// (PostgreSQL, plain or partitioned, detected
// from the table), mysql:// (MySQL / MariaDB), sqlite:PATH, file:PATH or a
// plain path (SQLite). Every time it prints or compares is the database's
// clock. Output is a table, or JSON with --json. The exit status is 0 on
// success, 1 when the command failed, 2 on a usage error.
//
// docs/retention.md describes retention, purging and partitions; `idem
// help COMMAND` describes each command and its flags.
package main

import "github.com/idemgo/idem/cmd/internal/command"

func main() { command.Main(run) }
