package idemmigrate

import (
	"fmt"

	"github.com/pressly/goose/v3"
)

// Dialect is what the migrator and the lease table need to know of one
// database's SQL: its goose dialect, placeholders, clock and catalog. The
// three values are Postgres, MySQL and SQLite; drivers pass theirs.
type Dialect struct {
	name  string
	goose goose.Dialect
	// nowUS is the database clock in integer microseconds since the Unix
	// epoch (UTC), fixed within a statement.
	nowUS string
	// greatest is the two-argument maximum function.
	greatest string
	// lockTable creates the lease table; %s is its name.
	lockTable string
	// tableExists answers one row with one boolean: does the table named
	// by the one placeholder exist (in the connection's schema or database)?
	tableExists string
	// dollar: placeholders are $1, $2 (PostgreSQL), else ?.
	dollar bool
	// transactionalDDL: a failed migration leaves none of its statements
	// applied (PostgreSQL, SQLite); MySQL commits each DDL statement.
	transactionalDDL bool
	// upsert: INSERT ... ON CONFLICT ... DO UPDATE ... WHERE ... RETURNING
	// takes a lease in one statement (PostgreSQL, SQLite); MySQL has
	// neither the WHERE nor RETURNING.
	upsert bool
}

// The dialects of idem's drivers.
var (
	// Postgres is PostgreSQL 13+ (idempgx): the clock is statement_timestamp().
	Postgres = Dialect{
		name: "postgres", goose: goose.DialectPostgres,
		nowUS:    `(floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint)`,
		greatest: "GREATEST",
		lockTable: `CREATE TABLE IF NOT EXISTS %s (
	name         text   NOT NULL PRIMARY KEY,
	holder       text   NOT NULL,
	token        bigint NOT NULL,
	locked_until bigint NOT NULL
)`,
		tableExists: `SELECT to_regclass($1) IS NOT NULL`,
		dollar:      true, transactionalDDL: true, upsert: true,
	}
	// MySQL is MySQL 8.0+ and MariaDB 10.6+, Galera clusters included
	// (idemmysql): the clock is NOW(6) as microseconds since the epoch.
	MySQL = Dialect{
		name: "mysql", goose: goose.DialectMySQL,
		nowUS:    `CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)`,
		greatest: "GREATEST",
		lockTable: "CREATE TABLE IF NOT EXISTS %s (\n" +
			"\tname         VARBINARY(255) NOT NULL PRIMARY KEY,\n" +
			"\tholder       VARBINARY(255) NOT NULL,\n" +
			"\ttoken        BIGINT         NOT NULL,\n" +
			"\tlocked_until BIGINT         NOT NULL\n" +
			") ENGINE = InnoDB",
		tableExists: `SELECT COUNT(*) > 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`,
	}
	// SQLite is SQLite 3.38+ (idemsqlite): the clock is unixepoch('subsec').
	SQLite = Dialect{
		name: "sqlite", goose: goose.DialectSQLite3,
		nowUS:    `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`,
		greatest: "max",
		lockTable: `CREATE TABLE IF NOT EXISTS %s (
	name         TEXT    NOT NULL PRIMARY KEY,
	holder       TEXT    NOT NULL,
	token        INTEGER NOT NULL,
	locked_until INTEGER NOT NULL
)`,
		tableExists:      `SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?`,
		transactionalDDL: true, upsert: true,
	}
)

// String names the dialect (postgres, mysql or sqlite).
func (d Dialect) String() string { return d.name }

// ph returns the i-th (1-based) placeholder.
func (d Dialect) ph(i int) string {
	if d.dollar {
		return fmt.Sprintf("$%d", i)
	}
	return "?"
}

// now is the database clock in microseconds moved by offsetUS, written into
// the statement as an integer literal (zero in production: one statement
// text).
func (d Dialect) now(offsetUS int64) string {
	if offsetUS == 0 {
		return d.nowUS
	}
	return fmt.Sprintf("(%s + %d)", d.nowUS, offsetUS)
}
