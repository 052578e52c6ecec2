package idemmysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3/database"

	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersionTable is the table in which the migration tool keeps the
// applied schema versions (in the pool's default database).
const SchemaVersionTable = "idem_schema_version"

// MigrateLockTimeout is how long Migrate waits for another process's
// migration to finish.
const MigrateLockTimeout = idemmigrate.DefaultLockTimeout

// Migrate applies the embedded migrations with idemmigrate (goose, MySQL
// dialect), recorded in SchemaVersionTable, under the migration lease in
// idem_locks (a row, replicated to every Galera node, not a GET_LOCK, which
// is local to one node), so processes starting together migrate once. It is
// safe to call on every start, also after a process died mid-migration:
// the version table is repaired under the lease, and a migration whose DDL
// committed before its version was recorded (the ALTER TABLE of 00002 to
// 00005, 00007 and 00008) is recorded, not run again. A migration that
// fails part-way is reported as a *MigrateError.
func (d *Driver) Migrate(ctx context.Context) error {
	m, err := d.embedded(ctx)
	if err != nil {
		return err
	}
	return m.Up(ctx)
}

// MigrateFS applies another set of goose SQL migrations (the files at the
// root of fsys) on d's database, as Migrate applies idem's: recorded in
// versionTable, under the lease "migrate <versionTable>", a failure part-way
// reported as a *MigrateError. For an application's own tables beside
// idem's: cmd/paymentsd migrates its own with it. idempgx and idemsqlite
// have the same method.
func (d *Driver) MigrateFS(ctx context.Context, fsys fs.FS, versionTable string) error {
	m, err := d.migrator(ctx, fsys, versionTable, nil)
	if err != nil {
		return err
	}
	return m.Up(ctx)
}

// migrator is idemmigrate's migrator of fsys on d's database; present is
// its Config.Present.
func (d *Driver) migrator(ctx context.Context, fsys fs.FS, versionTable string,
	present func(context.Context, idemmigrate.Queryer, int64) (bool, error)) (*idemmigrate.Migrator, error) {
	var database sql.NullString
	if err := d.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
		return nil, fmt.Errorf("idemmysql: migrate: %w", err)
	}
	if !database.Valid || database.String == "" {
		return nil, errors.New("idemmysql: migrate: the connection has no default database (name one in the URL's path)")
	}
	store, err := newVersionStore(versionTable)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: migrations: %w", err)
	}
	return idemmigrate.New(idemmigrate.Config{Prefix: "idemmysql", DB: d.db, Dialect: idemmigrate.MySQL,
		FS: fsys, VersionTable: versionTable, Store: store, Leases: d.leases, Present: present})
}

// embedded is the migrator of idem's own migrations.
func (d *Driver) embedded(ctx context.Context) (*idemmigrate.Migrator, error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	return d.migrator(ctx, sub, SchemaVersionTable, embeddedPresent)
}

// embeddedPresent is the Config.Present of idem's own migrations. Only the
// migrations that alter a table (00002 owner, 00003 seal_key, 00004
// request, 00005 seal_tag, 00007 the steps' at-most-once and resolution
// columns, 00008 the UNKNOWN state) can be left applied and unrecorded:
// each is one ALTER TABLE, which commits on its own (00001 and 00006 create
// their tables IF NOT EXISTS and run again unharmed). Such a migration is
// present when its table has its column (one ALTER TABLE adds all of
// 00007's, or none), or, for 00008, when the CHECK constraint on state
// allows 'UNKNOWN' (running it again would be harmless, but copies
// idem_keys).
func embeddedPresent(ctx context.Context, db idemmigrate.Queryer, version int64) (bool, error) {
	var n int
	var err error
	switch version {
	case 8:
		err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS
		WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_NAME = 'idem_keys_state' AND CHECK_CLAUSE LIKE '%UNKNOWN%'`).Scan(&n)
	default:
		column, ok := map[int64][2]string{2: {"idem_keys", "owner"}, 3: {"idem_keys", "seal_key"}, 4: {"idem_keys", "request"},
			5: {"idem_keys", "seal_tag"}, 7: {"idem_steps", "at_most_once"}}[version]
		if !ok {
			return false, nil
		}
		err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`, column[0], column[1]).Scan(&n)
	}
	return n >= 1, err
}

// MigrateError reports a migration that failed. MySQL has no transactional
// DDL: each DDL statement commits on its own, so the statements of the
// failed version that ran before the failing one stay applied, while the
// version itself is not recorded as applied. Undo them (or finish the
// version by hand and record it) before migrating again.
type MigrateError = idemmigrate.Error

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
		res.Timestamp = idemsql.MicrosTime(us.Int64)
	}
	return res, nil
}
