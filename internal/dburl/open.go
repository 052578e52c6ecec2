package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
)

// Driver is what every command needs of an idem store: the claim protocol
// and the optional interfaces of retention, operations and migrations
// (idemdriver's Purger, Inspector, Lister, Remover and Migrator), and
// MigrateFS for a service's own tables. The three drivers
// Open returns (*idempgx.Driver, *idemmysql.Driver, *idemsqlite.Driver)
// implement them all; only idemdriver.Partitioner depends on the table.
type Driver interface {
	idemdriver.Driver
	idemdriver.Purger
	idemdriver.Inspector
	idemdriver.Lister
	idemdriver.Remover
	idemdriver.Migrator
	// MigrateFS applies an application's own goose migrations (a
	// service's tables) through idem's migrator, recorded in versionTable.
	MigrateFS(ctx context.Context, fsys fs.FS, versionTable string) error
}

// Options shape Open.
type Options struct {
	// Partitioned asks for idempgx's partitioned driver on PostgreSQL. Without
	// it, an existing idem_keys table decides (a partitioned table gets the
	// partitioned driver); with it, a plain existing table is an error. It is
	// an error on MySQL and SQLite, which have no partitioned mode.
	Partitioned bool
	// MustExist refuses a SQLite file that does not exist yet (a
	// *NoFileError) instead of creating it: an operator's mistyped
	// path must not leave an empty database behind.
	MustExist bool
}

// Store is an idem store Open opened: the driver, and the pool under it for
// a program's own queries (Pool on PostgreSQL, SQL on MySQL and SQLite; the
// other is nil). Both go through the same connections, so a transaction
// idem begins (idempgx.Tx, idemmysql.Tx, idemsqlite.Tx) sees the program's
// tables.
type Store struct {
	// Kind is Postgres, MySQL or SQLite.
	Kind string
	// Driver is idem's driver on the database.
	Driver Driver
	// Pool is the pgx pool on PostgreSQL; nil on the others.
	Pool *pgxpool.Pool
	// SQL is the driver's database/sql pool on MySQL and SQLite
	// (idemmysql.Driver.DB, idemsqlite.Driver.DB); nil on PostgreSQL.
	SQL *sql.DB
	// Partitioned is true for a PostgreSQL store in partitioned mode.
	Partitioned bool

	close func() error
	// path and file are the SQLite file's path and what it was when opened.
	path string
	file os.FileInfo
}

// ErrFileChanged is CheckFile's error when the SQLite file at the store's
// path is not the file the store has open.
var ErrFileChanged = errors.New("the SQLite database file was deleted or replaced since it was opened")

// CheckFile reports whether a SQLite store's file is still the one at its
// path: an error wrapping ErrFileChanged when the path names no file or
// another file (device and inode differ, os.SameFile). A deleted file stays
// readable and writable through the open connections, so every query
// succeeds while its writes go to an inode that nothing will ever open
// again: lost at the next start. nil for PostgreSQL and MySQL.
func (s *Store) CheckFile() error {
	if s.file == nil {
		return nil
	}
	fi, err := os.Stat(s.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	if err != nil || !os.SameFile(s.file, fi) {
		return fmt.Errorf("%s: %w", s.path, ErrFileChanged)
	}
	return nil
}

// Close closes the driver and the pool under it.
func (s *Store) Close() error { return s.close() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if s.Pool != nil {
		return s.Pool.Ping(ctx)
	}
	return s.SQL.PingContext(ctx)
}

// Open opens idem's driver on the database of kind at target, as Parse
// returned them, without migrating it (Driver.Migrate does):
//
//   - Postgres: a pgxpool on the URL, which the detection of a partitioned
//     idem_keys (idempgx.IsPartitioned) checks on the way; idempgx.New or,
//     for a partitioned table or o.Partitioned, idempgx.NewPartitioned.
//     Errors start with "postgres: ".
//   - MySQL: idemmysql.Open (idemmysql.ParseURL's URL form).
//   - SQLite: idemsqlite.Open on the file, created if missing unless
//     o.MustExist.
//
// On any error, nothing is left open.
func Open(ctx context.Context, kind, target string, o Options) (*Store, error) {
	switch kind {
	case Postgres:
		pool, err := pgxpool.New(ctx, target)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		exists, isPart, err := idempgx.IsPartitioned(ctx, pool)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
		partitioned := o.Partitioned
		switch {
		case exists && partitioned && !isPart:
			pool.Close()
			return nil, errors.New("--partitioned: idem_keys exists and is not partitioned (see docs/retention.md to convert)")
		case exists:
			partitioned = isPart
		}
		s := &Store{Kind: kind, Pool: pool, Partitioned: partitioned, close: func() error { pool.Close(); return nil }}
		if partitioned {
			s.Driver = idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
		} else {
			s.Driver = idempgx.New(pool)
		}
		return s, nil
	case MySQL:
		if o.Partitioned {
			return nil, errors.New("--partitioned is PostgreSQL's partitioned mode; MySQL stores are not partitioned")
		}
		d, err := idemmysql.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		return &Store{Kind: kind, Driver: d, SQL: d.DB(), close: d.Close}, nil
	case SQLite:
		if o.Partitioned {
			return nil, errors.New("--partitioned is PostgreSQL's partitioned mode; SQLite stores are not partitioned")
		}
		if o.MustExist {
			if _, err := os.Stat(target); errors.Is(err, fs.ErrNotExist) {
				return nil, &NoFileError{Path: target}
			}
		}
		d, err := idemsqlite.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		// The file exists once Open has connected (it creates it).
		fi, err := os.Stat(target)
		if err != nil {
			d.Close()
			return nil, err
		}
		return &Store{Kind: kind, Driver: d, SQL: d.DB(), close: d.Close, path: target, file: fi}, nil
	}
	return nil, fmt.Errorf("unknown kind of database %q", kind)
}

// NoFileError is Open's error for a SQLite file that does not exist, with
// Options.MustExist. It matches fs.ErrNotExist.
type NoFileError struct {
	// Path is the missing file.
	Path string
}

func (e *NoFileError) Error() string { return "no SQLite database at " + e.Path }

// Unwrap returns fs.ErrNotExist.
func (e *NoFileError) Unwrap() error { return fs.ErrNotExist }
