// Package idemmigrate is the one migrator of idem's drivers and of the
// applications beside them: each driver hands it its embedded goose SQL
// migrations, its Dialect and its version table, and it applies, lists and
// rolls them back, with goose underneath, under a lease (see Leases) that
// serializes every process sharing the database. The lock, the version
// table's handling, the status check and the error reporting live here
// once; idempgx, idemmysql and idemsqlite expose them as Migrate, MigrateFS,
// MigrationStatus and MigrateDown.
//
// Why a lease and not goose's session lockers: a session lock
// (pg_advisory_lock, GET_LOCK) stays on a pooled server connection behind
// pgbouncer's transaction pooling, and GET_LOCK is local to one Galera node.
// Why not goose's table lockers: they have no fencing token, no movable clock
// for tests, and no SQLite; the maintainer needs all three from the same
// table.
//
// The package imports only the seam (idemdriver) and goose; it never imports
// the core, and drivers use it without it.
//
// Stability: the API follows idem's drivers (it is part of what a driver
// author uses) and may change with them before idem 1.0.
package idemmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/idemgo/idem/idemdriver"
)

// Defaults of Config.
const (
	// DefaultLockTimeout is how long Up, Status and Down wait for another
	// process's migration to finish.
	DefaultLockTimeout = 5 * time.Minute
	// DefaultLockTTL is how long the migration lease outlives a process
	// that died while migrating: another process's Migrate then waits at
	// most this long. The holder renews it every third of it.
	DefaultLockTTL = 30 * time.Second
)

// Config describes one set of migrations on one database.
type Config struct {
	// Prefix starts every error ("idempgx", "paymentsd").
	Prefix string
	// DB is the database, a database/sql handle (on PostgreSQL, pgx's
	// stdlib.OpenDBFromPool on the driver's pool).
	DB *sql.DB
	// Dialect is the database's SQL.
	Dialect Dialect
	// FS holds the goose SQL migrations at its root (numbered files,
	// 00001_name.sql).
	FS fs.FS
	// VersionTable is the goose version table of the set, which also names
	// its migration lease ("migrate <VersionTable>"). Required.
	VersionTable string
	// Store replaces goose's version store of Dialect (MySQL: one that reads
	// its timestamps on a pool without parseTime). Default: goose's.
	Store database.Store
	// Leases is the lease table the migration lock is taken in. Default:
	// DefaultLeaseTable on DB.
	Leases *Leases
	// LockTimeout bounds the wait for another process's migration.
	// Default: DefaultLockTimeout.
	LockTimeout time.Duration
	// LockTTL is the migration lease's TTL. Default: DefaultLockTTL.
	LockTTL time.Duration
	// Present reports whether the schema already holds what migration
	// version makes, though the version table does not record it: on a
	// database whose DDL commits statement by statement (MySQL), a process
	// killed between a migration's last statement and goose's record of it
	// leaves it so, and running it again fails (a column that exists). Up
	// records such a version as applied instead of running it: under the
	// lease, before goose, for each version not recorded as applied, in
	// order, up to the first for which Present reports false. Default: nil,
	// every pending version runs.
	Present func(ctx context.Context, db Queryer, version int64) (bool, error)
}

// Migrator applies one set of migrations (see Config).
type Migrator struct {
	cfg   Config
	store database.Store
}

// New checks cfg and returns its migrator.
func New(cfg Config) (*Migrator, error) {
	if cfg.DB == nil || cfg.FS == nil || cfg.VersionTable == "" {
		return nil, fmt.Errorf("%s: migrations: DB, FS and VersionTable are required", cfg.Prefix)
	}
	if cfg.Leases == nil {
		cfg.Leases = NewLeases(cfg.DB, cfg.Dialect, "")
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = DefaultLockTimeout
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = DefaultLockTTL
	}
	store := cfg.Store
	if store == nil {
		s, err := database.NewStore(cfg.Dialect.goose, cfg.VersionTable)
		if err != nil {
			return nil, fmt.Errorf("%s: migrations: %w", cfg.Prefix, err)
		}
		store = s
	}
	return &Migrator{cfg: cfg, store: store}, nil
}

// locked runs f under the set's migration lease, with a goose provider
// whose version table exists with its version 0 row. f's context is
// cancelled if the lease is lost (a stall past LockTTL).
func (m *Migrator) locked(ctx context.Context, log *statementLog, f func(context.Context, *goose.Provider) error) error {
	lease, err := m.cfg.Leases.Acquire(ctx, LeaseParams{
		Name: "migrate " + m.cfg.VersionTable, Holder: Holder(), TTL: m.cfg.LockTTL,
	}, m.cfg.LockTimeout)
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", m.cfg.Prefix, err)
	}
	kept, stop := lease.Keep(ctx)
	err = m.withProvider(kept, log, f)
	if lost := stop(); lost != nil {
		err = errors.Join(err, lost)
	}
	return errors.Join(err, lease.Release(context.WithoutCancel(ctx)))
}

func (m *Migrator) withProvider(ctx context.Context, log *statementLog, f func(context.Context, *goose.Provider) error) error {
	if err := m.ensureVersionTable(ctx); err != nil {
		return err
	}
	opts := []goose.ProviderOption{
		goose.WithStore(m.store),
		goose.WithDisableGlobalRegistry(true), // an application's own Go migrations are not ours
	}
	if log != nil {
		opts = append(opts, goose.WithVerbose(true), goose.WithSlog(slog.New(log)))
	}
	p, err := goose.NewProvider(goose.DialectCustom, m.cfg.DB, m.cfg.FS, opts...)
	if err != nil {
		return fmt.Errorf("%s: migrations: %w", m.cfg.Prefix, err)
	}
	return f(ctx, p)
}

// ensureVersionTable makes the version table exist with its version 0 row,
// under the lease. Goose creates it by itself, but outside any lock (on
// first use, before its session locker) and, where DDL commits on its own
// (MySQL), in two commits: a process that dies between them, or that races
// another, leaves a table without its version 0 row, on which goose fails
// "missing zero version migration" on every later start. Here a missing row
// is inserted, whatever left it missing.
func (m *Migrator) ensureVersionTable(ctx context.Context) (err error) {
	conn, err := m.cfg.DB.Conn(ctx)
	if err != nil {
		return m.versionErr(err)
	}
	defer func() { err = errors.Join(err, m.versionErr(conn.Close())) }()
	exists, err := TableExists(ctx, conn, m.cfg.Dialect, m.cfg.VersionTable)
	if err != nil {
		return m.versionErr(err)
	}
	if !exists {
		if err := m.store.CreateVersionTable(ctx, conn); err != nil {
			return m.versionErr(err)
		}
	}
	_, err = m.store.GetMigration(ctx, conn, 0)
	if errors.Is(err, database.ErrVersionNotFound) {
		err = m.store.Insert(ctx, conn, database.InsertRequest{Version: 0})
	}
	return m.versionErr(err)
}

// recordPresent records as applied the versions not recorded that
// Config.Present finds in the schema, oldest first, up to the first it does
// not find.
func (m *Migrator) recordPresent(ctx context.Context, p *goose.Provider) error {
	if m.cfg.Present == nil {
		return nil
	}
	for _, src := range p.ListSources() {
		rec, err := m.store.GetMigration(ctx, m.cfg.DB, src.Version)
		switch {
		case err == nil && rec.IsApplied:
			continue
		case err != nil && !errors.Is(err, database.ErrVersionNotFound):
			return m.versionErr(err)
		}
		present, err := m.cfg.Present(ctx, m.cfg.DB, src.Version)
		if err != nil {
			return fmt.Errorf("%s: migrate: is version %d present: %w", m.cfg.Prefix, src.Version, err)
		}
		if !present {
			return nil
		}
		if err := m.store.Insert(ctx, m.cfg.DB, database.InsertRequest{Version: src.Version}); err != nil {
			return m.versionErr(err)
		}
	}
	return nil
}

func (m *Migrator) versionErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: migrate: version table %s: %w", m.cfg.Prefix, m.cfg.VersionTable, err)
}

// Up applies every pending migration, under the migration lease, and is
// safe to call on every start of every process. A migration that fails is
// reported as an *Error.
func (m *Migrator) Up(ctx context.Context) error {
	log := &statementLog{}
	return m.locked(ctx, log, func(ctx context.Context, p *goose.Provider) error {
		if err := m.recordPresent(ctx, p); err != nil {
			return err
		}
		_, err := p.Up(ctx)
		if err == nil {
			return nil
		}
		var partial *goose.PartialError
		if !errors.As(err, &partial) || partial.Failed == nil || partial.Failed.Source == nil {
			return fmt.Errorf("%s: migrate: %w", m.cfg.Prefix, err)
		}
		e := &Error{Prefix: m.cfg.Prefix, Version: partial.Failed.Source.Version, Source: path.Base(partial.Failed.Source.Path),
			Err: partial.Err, committedDDL: !m.cfg.Dialect.transactionalDDL}
		e.Statement, e.SQL = log.last(e.Version)
		if v, verr := p.GetDBVersion(context.WithoutCancel(ctx)); verr == nil {
			e.LastApplied = v
		} else {
			e.Err = errors.Join(e.Err, fmt.Errorf("reading the applied version: %w", verr))
		}
		return e
	})
}

// Status lists the set's migrations, oldest first, with whether each is
// applied, read under the migration lease (it waits for a migration in
// progress). An applied migration whose tables are gone (CREATE TABLE in its
// Up, not dropped by a later applied migration's Up, missing from the
// database) lists them in Missing: the version table says applied, the
// database does not.
func (m *Migrator) Status(ctx context.Context) ([]idemdriver.Migration, error) {
	var out []idemdriver.Migration
	err := m.locked(ctx, nil, func(ctx context.Context, p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("%s: migration status: %w", m.cfg.Prefix, err)
		}
		tables := map[string]bool{} // created by the applied migrations so far and not dropped
		for _, s := range st {
			mig := idemdriver.Migration{Version: s.Source.Version, Name: path.Base(s.Source.Path), Applied: s.State == goose.StateApplied}
			if mig.Applied {
				if !s.AppliedAt.IsZero() {
					t := s.AppliedAt.UTC()
					mig.AppliedAt = &t
				}
				created, dropped, err := upTables(m.cfg.FS, s.Source.Path)
				if err != nil {
					return fmt.Errorf("%s: migration status: %w", m.cfg.Prefix, err)
				}
				for _, t := range dropped {
					delete(tables, t)
				}
				for _, t := range created {
					tables[t] = true
				}
			}
			out = append(out, mig)
		}
		return m.markMissing(ctx, out, tables)
	})
	return out, err
}

// markMissing checks that the tables exist, and names each missing one in
// the latest applied migration that creates it.
func (m *Migrator) markMissing(ctx context.Context, list []idemdriver.Migration, tables map[string]bool) error {
	names := make([]string, 0, len(tables))
	for t := range tables {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		ok, err := TableExists(ctx, m.cfg.DB, m.cfg.Dialect, t)
		if err != nil {
			return fmt.Errorf("%s: migration status: table %s: %w", m.cfg.Prefix, t, err)
		}
		if ok {
			continue
		}
		for i := len(list) - 1; i >= 0; i-- {
			if !list[i].Applied {
				continue
			}
			created, _, err := upTables(m.cfg.FS, list[i].Name)
			if err != nil {
				return err
			}
			if slices.Contains(created, t) {
				list[i].Missing = append(list[i].Missing, t)
				break
			}
		}
	}
	return nil
}

// Down rolls back the most recent applied migration, under the migration
// lease, and returns it. It returns an error when no migration is applied,
// and one wrapping idemdriver.ErrDropsRecords, rolling back nothing, when
// the rollback would drop a table of records (idem_keys, idem_steps or one
// of idem_keys's partitions) that holds a row, or idem_steps's
// at_most_once or the UNKNOWN state while an at-most-once step is started
// without a result.
func (m *Migrator) Down(ctx context.Context) (idemdriver.Migration, error) {
	return m.down(ctx, false)
}

// DownDroppingRecords is Down, but it rolls back a migration whose
// rollback drops a table of records that holds rows, and those rows with
// it.
func (m *Migrator) DownDroppingRecords(ctx context.Context) (idemdriver.Migration, error) {
	return m.down(ctx, true)
}

func (m *Migrator) down(ctx context.Context, dropRecords bool) (idemdriver.Migration, error) {
	var out idemdriver.Migration
	err := m.locked(ctx, nil, func(ctx context.Context, p *goose.Provider) error {
		if !dropRecords {
			if err := m.keepsRecords(ctx, p); err != nil {
				return err
			}
		}
		res, err := p.Down(ctx)
		if err != nil {
			if errors.Is(err, goose.ErrNoNextVersion) || errors.Is(err, goose.ErrNoCurrentVersion) {
				return fmt.Errorf("%s: migrate down: no migration is applied", m.cfg.Prefix)
			}
			return fmt.Errorf("%s: migrate down: %w", m.cfg.Prefix, err)
		}
		out = idemdriver.Migration{Version: res.Source.Version, Name: path.Base(res.Source.Path)}
		return nil
	})
	return out, err
}

var (
	createTableRE = regexp.MustCompile(`(?im)^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([A-Za-z_][\w.]*)`)
	dropTableRE   = regexp.MustCompile(`(?im)^\s*DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?([A-Za-z_][\w.]*)`)
	sectionRE     = regexp.MustCompile(`(?m)^--\s*\+goose\s+(Up|Down)\b`)
)

// keepsRecords returns an error wrapping idemdriver.ErrDropsRecords when
// rolling back p's most recent applied migration would drop a table of
// records that holds a row: a record or a step, whose loss lets a retry
// run again what it recorded (an at-most-once step among them).
func (m *Migrator) keepsRecords(ctx context.Context, p *goose.Provider) error {
	v, err := p.GetDBVersion(ctx)
	if err != nil || v == 0 {
		return nil // p.Down says what is wrong
	}
	for _, src := range p.ListSources() {
		if src.Version != v {
			continue
		}
		b, err := fs.ReadFile(m.cfg.FS, path.Base(src.Path))
		if err != nil {
			return err
		}
		for _, mm := range dropTableRE.FindAllStringSubmatch(sectionOf(string(b), "Down"), -1) {
			t := mm[1]
			if !strings.HasPrefix(t, "idem_keys") && !strings.HasPrefix(t, "idem_steps") {
				continue
			}
			if ok, err := TableExists(ctx, m.cfg.DB, m.cfg.Dialect, t); err != nil {
				return fmt.Errorf("%s: migrate down: table %s: %w", m.cfg.Prefix, t, err)
			} else if !ok {
				continue // made by the rollback itself (a table rebuilt), or gone
			}
			var one int
			switch err := m.cfg.DB.QueryRowContext(ctx, "SELECT 1 FROM "+t+" LIMIT 1").Scan(&one); {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return fmt.Errorf("%s: migrate down: reading %s: %w", m.cfg.Prefix, t, err)
			default:
				return fmt.Errorf("%s: migrate down: rolling back %d (%s) drops %s, which holds rows: %w",
					m.cfg.Prefix, v, path.Base(src.Path), t, idemdriver.ErrDropsRecords)
			}
		}
		if up := sectionOf(string(b), "Up"); strings.Contains(up, "at_most_once") || strings.Contains(up, "'UNKNOWN'") {
			return m.keepsAtMostOnce(ctx, v, path.Base(src.Path))
		}
	}
	return nil
}

// keepsAtMostOnce returns an error wrapping idemdriver.ErrDropsRecords
// when rolling back version v (name), which brought what keeps an
// at-most-once step from running twice (idem_steps's at_most_once, or the
// UNKNOWN state its uncertain start ends in), while such a step is started
// without a result: as an ordinary step, or one whose record cannot become
// UNKNOWN, a retry would run it again, or fail with a 503 after its call.
func (m *Migrator) keepsAtMostOnce(ctx context.Context, v int64, name string) error {
	if ok, err := TableExists(ctx, m.cfg.DB, m.cfg.Dialect, "idem_steps"); err != nil {
		return fmt.Errorf("%s: migrate down: table idem_steps: %w", m.cfg.Prefix, err)
	} else if !ok {
		return nil
	}
	var one int
	switch err := m.cfg.DB.QueryRowContext(ctx, "SELECT 1 FROM idem_steps WHERE at_most_once AND NOT done AND started_token <> 0 LIMIT 1").Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("%s: migrate down: reading idem_steps: %w", m.cfg.Prefix, err)
	}
	return fmt.Errorf("%s: migrate down: rolling back %d (%s) takes away what keeps an at-most-once step from running twice "+
		"(its at_most_once mark, or the UNKNOWN state) while one is started without a result: %w", m.cfg.Prefix, v, name, idemdriver.ErrDropsRecords)
}

// upTables reads the tables that a migration's Up section creates and
// drops, from its statements that begin a line (not those inside a
// function body's StatementBegin block).
func upTables(fsys fs.FS, name string) (created, dropped []string, err error) {
	b, err := fs.ReadFile(fsys, path.Base(name))
	if err != nil {
		return nil, nil, err
	}
	up := sectionOf(string(b), "Up")
	for _, mm := range createTableRE.FindAllStringSubmatch(up, -1) {
		created = append(created, mm[1])
	}
	for _, mm := range dropTableRE.FindAllStringSubmatch(up, -1) {
		dropped = append(dropped, mm[1])
	}
	return created, dropped, nil
}

// sectionOf is the text of a migration's Up or Down section (which), without
// its StatementBegin blocks.
func sectionOf(s, which string) string {
	var b strings.Builder
	section, block := "", false
	for _, line := range strings.Split(s, "\n") {
		if mm := sectionRE.FindStringSubmatch(line); mm != nil {
			section = mm[1]
			continue
		}
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "-- +goose StatementBegin"):
			block = true
		case strings.HasPrefix(t, "-- +goose StatementEnd"):
			block = false
		case section == which && !block && !strings.HasPrefix(t, "--"):
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Holder names this process in a lease row: "hostname:pid".
func Holder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// Error reports a migration that failed.
type Error struct {
	// Prefix is Config.Prefix.
	Prefix string
	// Version and Source name the migration that failed.
	Version int64
	Source  string
	// Statement is the 1-based index of the failing statement among the
	// version's Up statements (0 if unknown); statements 1 to Statement-1
	// ran. SQL is the failing statement's text.
	Statement int
	SQL       string
	// LastApplied is the highest version recorded in the version table
	// after the failure (0 when none is).
	LastApplied int64
	// Err is the database's error.
	Err error

	// committedDDL: the statements before the failing one stay applied
	// (MySQL commits DDL statement by statement).
	committedDDL bool
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: migration %d (%s) failed", e.Prefix, e.Version, e.Source)
	if e.Statement > 0 {
		msg += fmt.Sprintf(" at its statement %d", e.Statement)
	}
	msg += fmt.Sprintf(": %v; last version applied: %d", e.Err, e.LastApplied)
	switch {
	case !e.committedDDL:
	case e.Statement > 2:
		msg += fmt.Sprintf("; statements 1-%d of version %d ran and stay applied (MySQL commits DDL statement by statement): undo them by hand before migrating again", e.Statement-1, e.Version)
	case e.Statement == 2:
		msg += fmt.Sprintf("; statement 1 of version %d ran and stays applied (MySQL commits DDL statement by statement): undo it by hand before migrating again", e.Version)
	}
	return msg
}

// Unwrap returns the database's error.
func (e *Error) Unwrap() error { return e.Err }

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
