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
	"sync"
	"time"

	"github.com/pressly/goose/v3"
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
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	return d.migrate(ctx, sub)
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

// migrate runs the migrations of fsys (tests pass broken sets).
func (d *Driver) migrate(ctx context.Context, fsys fs.FS) error {
	var database sql.NullString
	if err := d.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
		return fmt.Errorf("idemmysql: migrate: %w", err)
	}
	if !database.Valid || database.String == "" {
		return errors.New("idemmysql: migrate: the connection has no default database (name one in the URL's path)")
	}
	log := &statementLog{}
	p, err := goose.NewProvider(goose.DialectMySQL, d.db, fsys,
		goose.WithTableName(SchemaVersionTable),
		goose.WithSessionLocker(getLock{name: migrateLockName(database.String)}),
		goose.WithDisableGlobalRegistry(true),
		goose.WithVerbose(true), goose.WithSlog(slog.New(log)))
	if err != nil {
		return fmt.Errorf("idemmysql: migrations: %w", err)
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

// migrateLockName is the GET_LOCK name serializing migrations of database.
// MySQL lock names are server-wide and at most 64 characters.
func migrateLockName(database string) string {
	const prefix = "idem_migrations."
	if len(prefix)+len(database) <= 64 {
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
