package service

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dburl"
)

// migrationLockTimeout is how long Open waits for another process's
// migration lock on PostgreSQL and MySQL, in seconds.
const migrationLockTimeout = 300

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
}

// DB is a service's open and migrated database: idem's driver on it, and
// the handle for the service's own queries (Pool on PostgreSQL, SQL on MySQL
// and SQLite; the other is nil). Both go through the same connections, so a
// transaction idem begins (idempgx.Tx, idemmysql.Tx, idemsqlite.Tx) sees the
// service's tables.
type DB struct {
	// Kind is dburl.Postgres, dburl.MySQL or dburl.SQLite.
	Kind string
	// Pool is the pgx pool on PostgreSQL; nil on the others.
	Pool *pgxpool.Pool
	// SQL is the driver's database/sql pool on MySQL and SQLite
	// (idemmysql.Driver.DB, idemsqlite.Driver.DB); nil on PostgreSQL.
	SQL *sql.DB

	driver interface {
		idem.Store
		Migrate(ctx context.Context) error
	}
	close func() error
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
//   - PostgreSQL (dburl.Postgres): a pgxpool on the URL (pgxpool syntax:
//     search_path=SCHEMA picks the schema), pinged before use. Errors
//     opening it start with "postgres: ". The service's migrations run under
//     an advisory lock named after schema.Service and the current schema
//     (an error when the search_path names no existing schema).
//   - MySQL or MariaDB (dburl.MySQL): idemmysql.Open (idemmysql.ParseURL's
//     URL form). The migrations run under GET_LOCK on
//     "<service>_migrations.<database>" (an error when the URL names no
//     database).
//   - SQLite (dburl.SQLite): idemsqlite.Open on the file, created if
//     missing; SQLite serializes the migrations itself.
//
// A lock held by another process starting at the same time is waited for
// up to 300 seconds. On any error, nothing is left open.
func Open(ctx context.Context, kind, target string, schema Schema) (*DB, error) {
	var d *DB
	switch kind {
	case dburl.Postgres:
		pool, err := pgxpool.New(ctx, target)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
		d = &DB{Kind: kind, Pool: pool, driver: idempgx.New(pool), close: func() error { pool.Close(); return nil }}
	case dburl.MySQL:
		drv, err := idemmysql.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		d = &DB{Kind: kind, SQL: drv.DB(), driver: drv, close: drv.Close}
	case dburl.SQLite:
		drv, err := idemsqlite.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		d = &DB{Kind: kind, SQL: drv.DB(), driver: drv, close: drv.Close}
	default:
		return nil, fmt.Errorf("%s: unknown kind of database %q", schema.Service, kind)
	}
	if err := d.migrate(ctx, schema); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Idem returns idem's driver on the database, for idem.Config.Store.
func (d *DB) Idem() idem.Store { return d.driver }

// Ping checks that the database answers.
func (d *DB) Ping(ctx context.Context) error {
	if d.Pool != nil {
		return d.Pool.Ping(ctx)
	}
	return d.SQL.PingContext(ctx)
}

// Close closes the database (idem's driver and the pool under it).
func (d *DB) Close() error { return d.close() }

// migrate applies idem's migrations, then schema's.
func (d *DB) migrate(ctx context.Context, schema Schema) error {
	if err := d.driver.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(schema.Migrations, "migrations/"+d.Kind)
	if err != nil {
		return err
	}
	opts := []goose.ProviderOption{goose.WithTableName(schema.VersionTable), goose.WithDisableGlobalRegistry(true)}
	db, dialect := d.SQL, goose.DialectSQLite3
	switch d.Kind {
	case dburl.Postgres:
		// The advisory lock is per service and schema, so that services (or
		// tests) using other schemas of the database do not wait for each
		// other; it is retried every second instead of goose's default five.
		var current *string
		if err := d.Pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
			return fmt.Errorf("%s: migrate: %w", schema.Service, err)
		}
		if current == nil {
			return fmt.Errorf("%s: migrate: the search_path names no existing schema", schema.Service)
		}
		lockID := int64(crc64.Checksum([]byte(schema.Service+":"+*current), crc64.MakeTable(crc64.ECMA)))
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, migrationLockTimeout))
		if err != nil {
			return err
		}
		db, dialect = stdlib.OpenDBFromPool(d.Pool), goose.DialectPostgres
		defer db.Close()
		opts = append(opts, goose.WithSessionLocker(locker))
	case dburl.MySQL:
		var database sql.NullString
		if err := d.SQL.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database); err != nil {
			return fmt.Errorf("%s: migrate: %w", schema.Service, err)
		}
		if !database.Valid || database.String == "" {
			return fmt.Errorf("%s: migrate: the connection has no current database (name one in the URL's path)", schema.Service)
		}
		dialect = goose.DialectMySQL
		l := mysqlLock{name: mysqlLockName(schema.Service+"_migrations.", database.String)}
		if err := ensureMySQLVersionTable(ctx, d.SQL, schema.VersionTable, l); err != nil {
			return fmt.Errorf("%s: migrate: version table %s: %w", schema.Service, schema.VersionTable, err)
		}
		opts = append(opts, goose.WithSessionLocker(l))
	}
	p, err := goose.NewProvider(dialect, db, sub, opts...)
	if err != nil {
		return fmt.Errorf("%s: migrations: %w", schema.Service, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", schema.Service, err)
	}
	return nil
}

// ensureMySQLVersionTable creates goose's version table and its version 0
// row under the migration lock, unless the table exists. Goose's Up first
// runs HasPending, which creates the table outside the session locker, and
// MySQL commits CREATE TABLE on its own: a process starting together with
// another could see the table before its version 0 row and fail with
// "missing zero version migration" (TestOpenMySQL, about one run in fifteen
// under -race). idemmysql does the same for idem's own table.
func ensureMySQLVersionTable(ctx context.Context, db *sql.DB, table string, l mysqlLock) (err error) {
	s, err := database.NewStore(database.DialectMySQL, table)
	if err != nil {
		return err
	}
	store, ok := s.(database.StoreExtender)
	if !ok {
		return fmt.Errorf("goose's MySQL store %T does not implement database.StoreExtender", s)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := l.SessionLock(ctx, conn); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.SessionUnlock(context.WithoutCancel(ctx), conn)) }()
	exists, err := store.TableExists(ctx, conn)
	if err != nil || exists {
		return err
	}
	if err := store.CreateVersionTable(ctx, conn); err != nil {
		return err
	}
	return store.Insert(ctx, conn, database.InsertRequest{Version: 0})
}

// mysqlLockName names a lock on database. MySQL lock names are server-wide
// and at most 64 characters (MySQL 8 refuses longer ones; MariaDB accepts
// them), and compared case-insensitively on MySQL 8 while database names
// are case-sensitive: a name too long, or with capitals, is replaced by the
// first 128 bits of its SHA-256 in hex (as idemmysql names its own).
func mysqlLockName(prefix, database string) string {
	if len(prefix)+len(database) <= 64 && strings.ToLower(database) == database {
		return prefix + database
	}
	sum := sha256.Sum256([]byte(database))
	return prefix + hex.EncodeToString(sum[:16])
}

// mysqlLock is a goose session locker on GET_LOCK / RELEASE_LOCK, held by
// the one connection goose migrates on (the server releases it if that
// connection dies).
type mysqlLock struct{ name string }

func (l mysqlLock) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, l.name, migrationLockTimeout).Scan(&got); err != nil {
		return err
	}
	if got.Int64 != 1 {
		return fmt.Errorf("migration lock %q not obtained in %d s", l.name, migrationLockTimeout)
	}
	return nil
}

func (l mysqlLock) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, `DO RELEASE_LOCK(?)`, l.name)
	return err
}
