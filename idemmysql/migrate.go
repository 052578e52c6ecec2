package idemmysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersionTable is the table in which the migration tool keeps the
// applied schema versions (in the pool's default database).
const SchemaVersionTable = "idem_schema_version"

// MigrateLockTimeout is how long Migrate waits for another process's
// migration to finish.
const MigrateLockTimeout = 5 * time.Minute

// Migrate applies the embedded migrations (goose, MySQL dialect) under a
// GET_LOCK named after the database, so processes starting together migrate
// once. It is safe to call on every start. A migration that fails part-way
// is reported as a *MigrateError.
func (d *Driver) Migrate(ctx context.Context) error {
	set, err := idemSet()
	if err != nil {
		return err
	}
	return d.migrate(ctx, set)
}

// MigrateFS applies another set of goose SQL migrations (the files at the
// root of fsys) on d's database, as Migrate applies idem's: recorded in
// versionTable, under a GET_LOCK named lockPrefix followed by the database
// (hashed when long), the version table created under that lock, a failure
// part-way reported as a *MigrateError. For an application's own tables
// beside idem's: cmd/paymentsd migrates its own with it.
func (d *Driver) MigrateFS(ctx context.Context, fsys fs.FS, versionTable, lockPrefix string) error {
	return d.migrate(ctx, migrationSet{fsys: fsys, table: versionTable, lockPrefix: lockPrefix})
}

// migrationSet is one set of migrations with its version table and lock.
type migrationSet struct {
	fsys       fs.FS
	table      string
	lockPrefix string
}

// idemSet is idem's own embedded migrations.
func idemSet() (migrationSet, error) {
	sub, err := fs.Sub(migrations, "migrations")
	return migrationSet{fsys: sub, table: SchemaVersionTable, lockPrefix: migrateLockPrefix}, err
}

// embeddedProvider is the goose provider of the embedded migrations, for
// status and down.
func (d *Driver) embeddedProvider(ctx context.Context) (*goose.Provider, error) {
	set, err := idemSet()
	if err != nil {
		return nil, err
	}
	return d.provider(ctx, set, nil)
}

// MigrateError reports a migration that failed. MySQL has no transactional
// DDL: each DDL statement commits on its own, so the statements of the
// failed version that ran before the failing one stay applied, while the
// version itself is not recorded as applied. Undo them (or finish the
// version by hand and record it) before migrating again.
type MigrateError struct {
	// Version and Source name the migration that failed.
	Version int64
	Source  string
	// Statement is the 1-based index of the failing statement among the
	// version's Up statements (0 if unknown); statements 1 to Statement-1
	// ran. SQL is the failing statement's text.
	Statement int
	SQL       string
	// LastApplied is the highest version recorded in SchemaVersionTable
	// after the failure (0 when none is).
	LastApplied int64
	// Err is the database's error.
	Err error
}

func (e *MigrateError) Error() string {
	msg := fmt.Sprintf("idemmysql: migration %d (%s) failed", e.Version, e.Source)
	if e.Statement > 0 {
		msg += fmt.Sprintf(" at its statement %d", e.Statement)
	}
	msg += fmt.Sprintf(": %v; last version applied: %d", e.Err, e.LastApplied)
	switch {
	case e.Statement > 2:
		msg += fmt.Sprintf("; statements 1-%d of version %d ran and stay applied (MySQL commits DDL statement by statement): undo them by hand before migrating again", e.Statement-1, e.Version)
	case e.Statement == 2:
		msg += fmt.Sprintf("; statement 1 of version %d ran and stays applied (MySQL commits DDL statement by statement): undo it by hand before migrating again", e.Version)
	}
	return msg
}

// Unwrap returns the database's error.
func (e *MigrateError) Unwrap() error { return e.Err }

// migrate runs the migrations of set (tests pass broken sets).
func (d *Driver) migrate(ctx context.Context, set migrationSet) error {
	log := &statementLog{}
	p, err := d.provider(ctx, set, log)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var partial *goose.PartialError
		if !errors.As(err, &partial) || partial.Failed == nil || partial.Failed.Source == nil {
			return fmt.Errorf("idemmysql: migrate: %w", err)
		}
		me := &MigrateError{Version: partial.Failed.Source.Version, Source: path.Base(partial.Failed.Source.Path), Err: partial.Err}
		me.Statement, me.SQL = log.last(me.Version)
		if v, verr := p.GetDBVersion(context.WithoutCancel(ctx)); verr == nil {
			me.LastApplied = v
		} else {
			me.Err = errors.Join(me.Err, fmt.Errorf("reading the applied version: %w", verr))
		}
		return me
	}
	return nil
}

// provider returns the goose provider of set on d's database: its version
// table (through versionStore), serialized across processes by GET_LOCK on
// its lock prefix and the database's name, goose's statements logged to log
// (nil: not logged).
func (d *Driver) provider(ctx context.Context, set migrationSet, log *statementLog) (*goose.Provider, error) {
	var database sql.NullString
	if err := d.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
		return nil, fmt.Errorf("idemmysql: migrate: %w", err)
	}
	if !database.Valid || database.String == "" {
		return nil, errors.New("idemmysql: migrate: the connection has no default database (name one in the URL's path)")
	}
	store, err := newVersionStore(set.table)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: migrations: %w", err)
	}
	lock := getLock{name: lockName(set.lockPrefix, database.String)}
	if err := d.ensureVersionTable(ctx, store, lock); err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{
		goose.WithStore(store),
		goose.WithSessionLocker(lock),
		goose.WithDisableGlobalRegistry(true),
	}
	if log != nil {
		opts = append(opts, goose.WithVerbose(true), goose.WithSlog(slog.New(log)))
	}
	p, err := goose.NewProvider(goose.DialectCustom, d.db, set.fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: migrations: %w", err)
	}
	return p, nil
}

// ensureVersionTable creates goose's version table and its version 0 row,
// under the migration lock, unless the table exists. Goose creates the
// table on first use outside its session locker (in Provider.HasPending,
// which Up runs first), so processes migrating a new database together
// would race there: one can see the table before the row of version 0 is
// committed, and fail with "missing zero version migration" (it made
// TestMigrateConcurrently fail about one run in ten). Here the table
// appears with its row under the lock, which every caller takes first.
func (d *Driver) ensureVersionTable(ctx context.Context, store versionStore, lock getLock) (err error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemmysql: migrate: %w", err)
	}
	defer conn.Close()
	if err := lock.SessionLock(ctx, conn); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lock.SessionUnlock(context.WithoutCancel(ctx), conn)) }()
	exists, err := store.TableExists(ctx, conn)
	if err != nil || exists {
		return store.wrap(err)
	}
	// Two statements: MySQL commits CREATE TABLE on its own anyway.
	if err := store.CreateVersionTable(ctx, conn); err != nil {
		return store.wrap(err)
	}
	return store.wrap(store.Insert(ctx, conn, database.InsertRequest{Version: 0}))
}

// wrap names the version table in err.
func (s versionStore) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("idemmysql: migrate: version table %s: %w", s.table, err)
}

// versionStore is goose's MySQL version store, except for GetMigration
// (used by Status): goose scans the DATETIME column tstamp into a
// time.Time, which fails on a pool without parseTime (New accepts any
// pool), and reads it in the pool's loc. This one reads tstamp as
// microseconds since the epoch, converted from the session's time zone (the
// zone goose's CURRENT_TIMESTAMP default wrote it in: +00:00 on Open's
// sessions) to UTC.
type versionStore struct {
	database.StoreExtender
	table string
}

func newVersionStore(table string) (versionStore, error) {
	s, err := database.NewStore(database.DialectMySQL, table)
	if err != nil {
		return versionStore{}, err
	}
	ext, ok := s.(database.StoreExtender)
	if !ok {
		return versionStore{}, fmt.Errorf("goose's MySQL store %T does not implement database.StoreExtender", s)
	}
	return versionStore{ext, table}, nil
}

// GetMigration implements database.Store: the version's latest record.
// When the session's time zone is a named zone and the server has no time
// zone tables, CONVERT_TZ gives NULL and tstamp is taken as UTC.
func (s versionStore) GetMigration(ctx context.Context, db database.DBTxConn, version int64) (*database.GetMigrationResult, error) {
	var (
		us      sql.NullInt64
		applied bool
	)
	err := db.QueryRowContext(ctx, `SELECT `+micros(`COALESCE(CONVERT_TZ(tstamp, @@session.time_zone, '+00:00'), tstamp)`)+`,
	is_applied FROM `+s.table+` WHERE version_id = ? ORDER BY id DESC LIMIT 1`, version).Scan(&us, &applied)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %d", database.ErrVersionNotFound, version)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to get migration %d: %w", version, err)
	}
	res := &database.GetMigrationResult{IsApplied: applied}
	if us.Valid {
		res.Timestamp = usTime(us.Int64)
	}
	return res, nil
}

// migrateLockPrefix starts the GET_LOCK name serializing idem's migrations
// of a database.
const migrateLockPrefix = "idem_migrations."

// migrateLockName is the GET_LOCK name serializing migrations of database.
func migrateLockName(database string) string { return lockName(migrateLockPrefix, database) }

// maintenanceLockName is the GET_LOCK name of database's maintenance lock
// (see Driver.TryLockMaintenance).
func maintenanceLockName(database string) string { return lockName("idem_maintenance.", database) }

// lockName names a lock on database. MySQL lock names are server-wide, at
// most 64 characters, and compared case-insensitively (MySQL 8; MariaDB
// 10.11 compares them as written), while database names are case-sensitive
// on most systems: a name too long, or with capitals, is replaced by the
// first 128 bits of its SHA-256 in hex.
func lockName(prefix, database string) string {
	if len(prefix)+len(database) <= 64 && strings.ToLower(database) == database {
		return prefix + database
	}
	sum := sha256.Sum256([]byte(database))
	return prefix + hex.EncodeToString(sum[:16])
}

// getLock is a goose session locker on MySQL's named locks: GET_LOCK and
// RELEASE_LOCK on the one connection goose migrates on. Goose has no MySQL
// session locker of its own (only a table-based one). The server releases
// the lock if the connection dies.
type getLock struct{ name string }

func (l getLock) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", l.name, int(MigrateLockTimeout.Seconds())).Scan(&got); err != nil {
		return fmt.Errorf("idemmysql: migrate: lock %q: %w", l.name, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("idemmysql: migrate: lock %q not obtained within %s (another process is migrating)", l.name, MigrateLockTimeout)
	}
	return nil
}

func (l getLock) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", l.name).Scan(&released); err != nil {
		return fmt.Errorf("idemmysql: migrate: unlock %q: %w", l.name, err)
	}
	if !released.Valid || released.Int64 != 1 {
		return fmt.Errorf("idemmysql: migrate: unlock %q: this connection did not hold it", l.name)
	}
	return nil
}

// statementLog records goose's "executing statement" log lines, which are
// the only place goose says which statement of a migration it ran.
type statementLog struct {
	mu    sync.Mutex
	stmts []loggedStatement
}

type loggedStatement struct {
	version int64
	sql     string
}

// last returns the index (1-based) and text of the last statement logged
// for version, the one that failed.
func (l *statementLog) last(version int64) (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, text := 0, ""
	for _, s := range l.stmts {
		if s.version == version {
			n, text = n+1, s.sql
		}
	}
	return n, text
}

func (l *statementLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *statementLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *statementLog) WithGroup(string) slog.Handler            { return l }
func (l *statementLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "executing statement" {
		return nil
	}
	var s loggedStatement
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "version":
			if a.Value.Kind() == slog.KindInt64 {
				s.version = a.Value.Int64()
			}
		case "statement":
			s.sql = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.stmts = append(l.stmts, s)
	l.mu.Unlock()
	return nil
}
