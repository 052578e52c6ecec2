package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dburl"
)

// operated is what the command line needs of a store: the claim protocol
// (Get, Migrate) and the optional interfaces of retention and operations.
// Every driver that openStore opens implements them all; only the
// Partitioner depends on the table (see partitioner).
type operated interface {
	idemdriver.Driver
	idemdriver.Purger
	idemdriver.Inspector
	idemdriver.Migrator
}

// store is an opened database and what kind it is.
type store struct {
	driver operated
	// kind is "postgres", "sqlite" or "mysql".
	kind string
	// partitioned is true for a PostgreSQL store in partitioned mode.
	partitioned bool
	close       func()
}

// parseDatabaseURL tells which database a --database-url names:
//   - postgres://... or postgresql://...: PostgreSQL (pgx URL syntax; add
//     search_path=... for another schema than the user's default);
//   - mysql://...: MySQL / MariaDB (idemmysql.Open's URL syntax);
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
	switch kind {
	case "postgres":
		pool, err := pgxpool.New(ctx, target)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		exists, isPart, err := idempgx.IsPartitioned(ctx, pool)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
		switch {
		case exists && partitioned && !isPart:
			pool.Close()
			return nil, errors.New("--partitioned: idem_keys exists and is not partitioned (see docs/retention.md to convert)")
		case exists:
			partitioned = isPart
		}
		s := &store{kind: kind, partitioned: partitioned, close: pool.Close}
		if partitioned {
			s.driver = idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
		} else {
			s.driver = idempgx.New(pool)
		}
		return s, nil
	case "mysql":
		if partitioned {
			return nil, errors.New("--partitioned is PostgreSQL's partitioned mode; MySQL stores are not partitioned")
		}
		d, err := idemmysql.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		return &store{driver: d, kind: kind, close: func() { d.Close() }}, nil
	default:
		if partitioned {
			return nil, errors.New("--partitioned is PostgreSQL's partitioned mode; SQLite stores are not partitioned")
		}
		if _, err := os.Stat(target); !create && errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no SQLite database at %s (a mistyped path? `idem migrate up` creates one)", target)
		}
		d, err := idemsqlite.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		return &store{driver: d, kind: kind, close: func() { d.Close() }}, nil
	}
}

// partitioner returns the store's Partitioner, or a clear error where there
// are no partitions.
func (s *store) partitioner() (idemdriver.Partitioner, error) {
	if s.kind != "postgres" {
		return nil, fmt.Errorf("partitions are PostgreSQL's partitioned mode; this %s store has none (expired records go with `idem purge`)", s.kind)
	}
	p, ok := s.driver.(idemdriver.Partitioner)
	if !ok || !p.Partitioned() {
		return nil, errors.New("idem_keys is not partitioned: it was created by `idem migrate up` without --partitioned; expired records go with `idem purge` (see docs/retention.md)")
	}
	return p, nil
}
