package main

import (
	"errors"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// conflicted reports whether err is the database refusing a transaction
// because it conflicted with another: a lost race, which the client cures
// by sending the request again, not a fault of the service. PostgreSQL:
// serialization_failure (40001) and deadlock_detected (40P01). MySQL and
// MariaDB: ER_LOCK_DEADLOCK (1213, also what Galera answers when another
// node's write won certification), ER_LOCK_WAIT_TIMEOUT (1205) and
// ER_CHECKREAD (1020, MariaDB's snapshot isolation).
func conflicted(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "40001" || pg.Code == "40P01"
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213 || my.Number == 1205 || my.Number == 1020
	}
	return false
}
