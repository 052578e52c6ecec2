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
// (idemdriver's Purger, Inspector, Lister, Remover and Migrator), the
// steps of recovery (idemdriver.Stepper), and
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
	idemdriver.Stepper
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
// idem begins (idem.Tx[pgx.Tx] or idemsqlite.Tx) sees the program's
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
//   - Postgres: a pgxpool on the URL without idem's own parameters
//     (ParamPooler, ParamSchema: see splitPGParams), which the detection of
//     a partitioned idem_keys (idempgx.IsPartitioned) checks on the way;
//     idempgx.NewWithOptions with TransactionPooler and Schema as the URL
//     says, partitioned for a partitioned table or o.Partitioned (not
//     available with idem_schema). Errors start with "postgres: ".
//   - MySQL: idemmysql.Open (idemmysql.ParseURL's URL form).
//   - SQLite: idemsqlite.Open on the file, created if missing unless
//     o.MustExist.
//
// On any error, nothing is left open.
func Open(ctx context.Context, kind, target string, o Options) (*Store, error) {
	switch kind {
	case Postgres:
		return openPostgres(ctx, target, o)
	case MySQL:
		if err := refuseIdemParams(kind, target); err != nil {
			return nil, err
		}
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
			return nil, errors.Join(err, d.Close())
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

// openPostgres is Open for a postgres:// URL.
func openPostgres(ctx context.Context, target string, o Options) (*Store, error) {
	pgURL, params, err := splitPGParams(target)
	if err != nil {
		return nil, err
	}
	if params.schema != "" && o.Partitioned {
		return nil, fmt.Errorf("--partitioned is not available with %s: the partitions are created in the search_path schema", ParamSchema)
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	fail := func(err error) (*Store, error) { pool.Close(); return nil, err }
	opts := idempgx.Options{TransactionPooler: params.transactionPooler, Schema: params.schema}
	partitioned := o.Partitioned
	if params.schema == "" {
		exists, isPart, err := idempgx.IsPartitioned(ctx, pool)
		switch {
		case err != nil:
			return fail(fmt.Errorf("postgres: %w", err))
		case exists && partitioned && !isPart:
			return fail(errors.New("--partitioned: idem_keys exists and is not partitioned (see docs/retention.md to convert)"))
		case exists:
			partitioned = isPart
		}
	} else {
		var kind *string
		err := pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass(quote_ident($1) || '.idem_keys'))`,
			params.schema).Scan(&kind)
		switch {
		case err != nil:
			return fail(fmt.Errorf("postgres: %w", err))
		case kind != nil && *kind == "p":
			return fail(fmt.Errorf("postgres: %s.idem_keys is partitioned, and %s is not available for a partitioned store: drop %s and use search_path",
				params.schema, ParamSchema, ParamSchema))
		}
	}
	if partitioned {
		opts.Partitioned = &idempgx.PartitionConfig{}
	}
	d, err := idempgx.NewWithOptions(pool, opts)
	if err != nil {
		return fail(fmt.Errorf("postgres: %w", err))
	}
	return &Store{Kind: Postgres, Driver: d, Pool: pool, Partitioned: partitioned,
		close: func() error { pool.Close(); return nil }}, nil
}
