package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"

	"github.com/pressly/goose/v3"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/dburl"
)

// Schema is a service's own tables, which Open migrates after idem's.
type Schema struct {
	// Service is the service's name, for example "paymentsd". It prefixes
	// migration errors ("paymentsd: migrate: ...") and names the migration
	// lock, so that services sharing a database do not wait for each other.
	Service string
	// VersionTable is the table in which goose records the service's
	// migrations, for example "paymentsd_schema_version" (idem's own are in
	// idem_schema_version).
	VersionTable string
	// Migrations holds goose SQL migrations in one directory per database
	// kind, named after dburl's kinds: migrations/postgres,
	// migrations/mysql and migrations/sqlite, as `//go:embed
	// migrations/*/*.sql` lays them out. Opening a kind without its
	// directory fails ("no migrations found").
	Migrations fs.FS
	// DefaultSQLitePath is the SQLite file that an empty --database-url
	// names (Schema.ParseURL), relative to the working directory, for
	// example "paymentsd.db".
	DefaultSQLitePath string
	// Unsupported, when not empty, maps a dburl kind the service cannot keep
	// its tables in to Schema.ParseURL's error for it.
	Unsupported map[string]string
}

// ParseURL reads the service's --database-url as ParseDatabaseURL does,
// with s.DefaultSQLitePath for an empty one; a kind in s.Unsupported is
// refused with its error.
func (s Schema) ParseURL(databaseURL string) (kind, target string, err error) {
	kind, target, err = ParseDatabaseURL(databaseURL, s.DefaultSQLitePath)
	if msg, ok := s.Unsupported[kind]; ok && err == nil {
		return "", "", errors.New(msg)
	}
	return kind, target, err
}

// OpenURL opens and migrates the database that databaseURL names
// (Schema.ParseURL, then Open).
func (s Schema) OpenURL(ctx context.Context, databaseURL string) (*DB, error) {
	kind, target, err := s.ParseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	return Open(ctx, kind, target, s)
}

// DB is a service's open and migrated database: the dburl.Store it was
// opened as (Kind, idem's Driver, and the handle for the service's own
// queries: Pool on PostgreSQL, SQL on MySQL and SQLite, the other nil; its
// Ping, CheckFile and Close), and how to name it in a log line.
type DB struct {
	*dburl.Store
	// describe is DescribeDatabase of the kind and target opened.
	describe string
}

// Rows is what the rows of a query on database/sql (*sql.Rows) and on pgx
// (pgx.Rows) both offer, so that one function reads either. Closing them
// stays with the caller.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ParseDatabaseURL reads a service's --database-url: empty means the SQLite
// file defaultSQLitePath (relative to the working directory); anything else
// is read by dburl.Parse. It returns dburl's kind (dburl.Postgres,
// dburl.MySQL or dburl.SQLite) and the URL or file path to open, or
// dburl.Parse's error.
func ParseDatabaseURL(s, defaultSQLitePath string) (kind, target string, err error) {
	if s == "" {
		return dburl.SQLite, defaultSQLitePath, nil
	}
	return dburl.Parse(s)
}

// DescribeDatabase names a database for a log line, without credentials:
// the URL with its password redacted for PostgreSQL and MySQL, or
// "sqlite:PATH". kind and target are ParseDatabaseURL's.
func DescribeDatabase(kind, target string) string {
	if kind == dburl.SQLite {
		return "sqlite:" + target
	}
	if u, err := url.Parse(target); err == nil {
		return u.Redacted()
	}
	return kind
}

// Open opens the database at target, of the kind ParseDatabaseURL returned,
// and migrates it: idem's migrations first, then schema's, with goose,
// recorded in schema.VersionTable. Migrating is safe on every start.
//
// The database is opened by dburl.Open, the opener every command shares.
//
//   - PostgreSQL (dburl.Postgres): a pgxpool on the URL (pgxpool syntax:
//     search_path=SCHEMA picks the schema; behind pgbouncer's transaction
//     pooling add idem_pooler=transaction and idem_schema=SCHEMA, which
//     dburl.Open reads, docs/deployment.md), checked by reading whether
//     idem_keys is partitioned (a partitioned table gets idempgx's
//     partitioned driver). Errors opening it start with "postgres: ".
//   - MySQL or MariaDB (dburl.MySQL): idemmysql.Open (idemmysql.ParseURL's
//     URL form); an error when the URL names no database. A migration that
//     fails part-way is an *idemmysql.MigrateError.
//   - SQLite (dburl.SQLite): idemsqlite.Open on the file, created if
//     missing.
//
// Every set runs through the driver's MigrateFS (idemdriver/idemmigrate),
// under the lease "migrate <VersionTable>" in the database's idem_locks
// table: processes starting together migrate one at a time, whether they
// share a server, a connection pooler or a Galera cluster. A lease held by
// another process is waited for up to 5 minutes
// (idemmigrate.DefaultLockTimeout); one left by a process that died runs
// out within 30 seconds. On any error, nothing is left open (an error
// closing the database is joined to it).
func Open(ctx context.Context, kind, target string, schema Schema) (*DB, error) {
	if kind != dburl.Postgres && kind != dburl.MySQL && kind != dburl.SQLite {
		return nil, fmt.Errorf("%s: unknown kind of database %q", schema.Service, kind)
	}
	st, err := dburl.Open(ctx, kind, target, dburl.Options{})
	if err != nil {
		return nil, err
	}
	d := &DB{Store: st, describe: DescribeDatabase(kind, target)}
	if err := d.migrate(ctx, schema); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

// Idem returns idem's driver on the database, the store of idem.NewMiddleware.
func (d *DB) Idem() idem.Store { return d.Driver }

// Describe names the database for a log line, without credentials
// (DescribeDatabase): "sqlite:PATH" or the URL with its password redacted.
func (d *DB) Describe() string { return d.describe }

// migrate applies idem's migrations, then schema's, through the same
// migrator (idemdriver/idemmigrate, each driver's MigrateFS): recorded in
// schema.VersionTable, under the lease "migrate <VersionTable>" in
// idem_locks, which holds behind a transaction pooler and across Galera
// nodes.
func (d *DB) migrate(ctx context.Context, schema Schema) error {
	if err := d.Driver.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(schema.Migrations, "migrations/"+d.Kind)
	if err != nil {
		return err
	}
	return migrateErr(schema.Service, d.Driver.MigrateFS(ctx, sub, schema.VersionTable))
}

// migrateErr names the service in a migration error (nil stays nil):
// "<service>: migrations: " when its set has no migrations for this
// database, "<service>: migrate: " when running them failed.
func migrateErr(service string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, goose.ErrNoMigrations):
		return fmt.Errorf("%s: migrations: %w", service, err)
	default:
		return fmt.Errorf("%s: migrate: %w", service, err)
	}
}
