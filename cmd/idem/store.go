package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/cmd/internal/dburl"
	"github.com/idemgo/idem/idemdriver"
)

// store is an opened database (dburl.Open, the opener every command
// shares).
type store struct{ *dburl.Store }

// parseDatabaseURL tells which database a --database-url names (dburl.Parse):
//   - postgres://... or postgresql://...: PostgreSQL (pgx URL syntax; add
//     search_path=... for another schema than the user's default, and
//     idem_pooler=transaction, idem_schema=NAME behind pgbouncer);
//   - mysql://... or mariadb://...: MySQL / MariaDB (idemmysql.Open's URL syntax);
//   - sqlite:PATH, sqlite://PATH, file:PATH, file://PATH or a plain PATH:
//     the SQLite file at PATH.
//
// It returns "postgres", "mysql" or "sqlite" and the URL or path.
func parseDatabaseURL(s string) (kind, target string, err error) {
	if s == "" {
		return "", "", errors.New("no database: give --database-url (or set IDEM_DATABASE_URL)")
	}
	return dburl.Parse(s)
}

// openStore opens the database that url names. On PostgreSQL an existing
// idem_keys table decides between the plain and the partitioned driver;
// partitioned asks for the partitioned one (needed only to create a new
// table with migrate up, and refused on a plain table). A SQLite file that
// does not exist is an error unless create is set (migrate up): a mistyped
// path must not leave an empty database behind.
func openStore(ctx context.Context, url string, partitioned, create bool) (*store, error) {
	kind, target, err := parseDatabaseURL(url)
	if err != nil {
		return nil, err
	}
	s, err := dburl.Open(ctx, kind, target, dburl.Options{Partitioned: partitioned, MustExist: !create})
	if nf := (*dburl.NoFileError)(nil); errors.As(err, &nf) {
		return nil, fmt.Errorf("%w (a mistyped path? `idem migrate up` creates one)", nf)
	}
	if err != nil {
		return nil, err
	}
	return &store{s}, nil
}

// partitioner returns the store's Partitioner, or a clear error where there
// are no partitions.
func (s *store) partitioner() (idemdriver.Partitioner, error) {
	if s.Kind != dburl.Postgres {
		return nil, fmt.Errorf("partitions are PostgreSQL's partitioned mode; this %s store has none (expired records go with `idem purge`)", s.Kind)
	}
	p, ok := s.Driver.(idemdriver.Partitioner)
	if !ok || !p.Partitioned() {
		return nil, errors.New("idem_keys is not partitioned: it was created by `idem migrate up` without --partitioned; expired records go with `idem purge` (see docs/retention.md)")
	}
	return p, nil
}

// missingTable reports whether err is the database saying that a table does
// not exist: PostgreSQL's SQLSTATE 42P01 (undefined_table), MySQL's error
// 1146 (ER_NO_SUCH_TABLE), SQLite's "no such table" (SQLITE_ERROR, told
// apart only by its message).
func missingTable(err error) bool {
	var pe *pgconn.PgError
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &pe):
		return pe.Code == "42P01"
	case errors.As(err, &me):
		return me.Number == 1146
	}
	return err != nil && strings.Contains(err.Error(), "no such table")
}
