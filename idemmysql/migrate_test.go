package idemmysql_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3/database"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
)

// brokenSet is the embedded migrations plus a version 2 whose second
// statement fails: its first statement commits on its own (MySQL has no
// transactional DDL) and its third never runs.
func brokenSet(t *testing.T) fstest.MapFS {
	t.Helper()
	first, err := fs.ReadFile(idemmysql.EmbeddedMigrations(), "00001_idem_keys.sql")
	require.NoError(t, err)
	return fstest.MapFS{
		"00001_idem_keys.sql": {Data: first},
		"00002_broken.sql": {Data: []byte(`-- +goose Up
CREATE TABLE half_applied (id INT PRIMARY KEY);
CREATE TABLE broken (;
CREATE TABLE never_applied (id INT PRIMARY KEY);

-- +goose Down
DROP TABLE never_applied;
DROP TABLE half_applied;
`)},
	}
}

func tableExists(t *testing.T, d *idemmysql.Driver, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, d.DB().QueryRow(`SELECT COUNT(*) FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, name).Scan(&n))
	return n == 1
}

func TestMigrateFailsHalfway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openUnmigrated(t, "")

	err := idemmysql.MigrateFS(d, ctx, brokenSet(t))
	var me *idemmysql.MigrateError
	require.True(t, errors.As(err, &me), "%v", err)
	require.EqualValues(t, 2, me.Version)
	require.Equal(t, "00002_broken.sql", me.Source)
	require.Equal(t, 2, me.Statement)
	require.Contains(t, me.SQL, "CREATE TABLE broken (")
	require.EqualValues(t, 1, me.LastApplied)
	msg := err.Error()
	t.Log(msg)
	require.Contains(t, msg, "migration 2 (00002_broken.sql) failed at its statement 2")
	require.Contains(t, msg, "last version applied: 1")
	require.Contains(t, msg, "statement 1 of version 2 ran and stays applied")
	require.Contains(t, msg, "Error 1064", "the database's own error is kept")

	require.True(t, tableExists(t, d, "idem_keys"))
	require.True(t, tableExists(t, d, "half_applied"), "MySQL committed the first statement of version 2")
	require.False(t, tableExists(t, d, "never_applied"))
	var version int64
	require.NoError(t, d.DB().QueryRow(`SELECT MAX(version_id) FROM `+idemmysql.SchemaVersionTable+` WHERE is_applied`).Scan(&version))
	require.EqualValues(t, 1, version, "version 2 is not recorded")

	// Repaired by hand, the set migrates.
	_, err = d.DB().Exec(`DROP TABLE half_applied`)
	require.NoError(t, err)
	fixed := brokenSet(t)
	fixed["00002_broken.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE half_applied (id INT PRIMARY KEY);\n")}
	require.NoError(t, idemmysql.MigrateFS(d, ctx, fixed))
	require.True(t, tableExists(t, d, "half_applied"))
}

// Processes starting together on one database migrate one at a time
// (GET_LOCK on the database's name): all succeed and version 1 is applied once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := dbtest.MySQLURL(t)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	drivers := make([]*idemmysql.Driver, 6)
	for i := range drivers {
		d, err := idemmysql.Open(ctx, url)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		drivers[i] = d
	}
	for _, d := range drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.Migrate(ctx)
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	var n int
	require.NoError(t, drivers[0].DB().QueryRow(`SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+` WHERE version_id = 1`).Scan(&n))
	require.Equal(t, 1, n)
}

// unmigrated opens a fresh database, not migrated, and goose's version
// store of idem's version table on it (to leave what an interrupted
// migration leaves).
func unmigrated(t *testing.T) (*idemmysql.Driver, database.Store) {
	t.Helper()
	url, _ := dbtest.MySQLURL(t)
	d, err := idemmysql.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	store, err := database.NewStore(database.DialectMySQL, idemmysql.SchemaVersionTable)
	require.NoError(t, err)
	return d, store
}

// A process killed between goose's CREATE TABLE of the version table and
// its INSERT of version 0 (MySQL commits the CREATE on its own), or three
// Galera nodes racing to create it, leave the table without its version 0
// row: goose then fails "missing zero version migration" on every later
// start. Migrate repairs the table under its lease and migrates.
func TestMigrateAfterVersionTableWithoutZeroRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, store := unmigrated(t)
	require.NoError(t, store.CreateVersionTable(ctx, d.DB()), "the state a SIGKILL after CREATE TABLE leaves")

	require.NoError(t, d.Migrate(ctx))
	require.True(t, tableExists(t, d, "idem_keys"))
	var n int
	require.NoError(t, d.DB().QueryRow(`SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+` WHERE version_id = 0`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, d.Migrate(ctx), "and again")
}

// migrate status notices a table dropped behind the version table's back:
// the migration that created it is still applied, and names it missing.
func TestMigrationStatusNamesMissingTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := open(t, "")
	list, err := d.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Empty(t, list[0].Missing)
	// idem_steps first: its foreign key refuses a DROP of idem_keys alone.
	_, err = d.DB().ExecContext(ctx, `DROP TABLE idem_steps, idem_keys`)
	require.NoError(t, err)
	list, err = d.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, "00001_idem_keys.sql", list[0].Name)
	require.True(t, list[0].Applied, "the version table still says so")
	require.Equal(t, []string{"idem_keys"}, list[0].Missing)
}

// A process killed after 00001's CREATE TABLE committed (MySQL commits DDL
// on its own) and before goose recorded version 1: the next Migrate applies
// the version again and records it, instead of failing "Table 'idem_keys'
// already exists" on every start.
func TestMigrateAfterKillBeforeVersionRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, store := unmigrated(t)
	require.NoError(t, store.CreateVersionTable(ctx, d.DB()))
	require.NoError(t, store.Insert(ctx, d.DB(), database.InsertRequest{Version: 0}))
	up, err := fs.ReadFile(idemmysql.EmbeddedMigrations(), "00001_idem_keys.sql")
	require.NoError(t, err)
	create := string(up)[strings.Index(string(up), "-- +goose Up")+len("-- +goose Up") : strings.Index(string(up), "-- +goose Down")]
	_, err = d.DB().ExecContext(ctx, create)
	require.NoError(t, err, "the state a SIGKILL after 00001's CREATE TABLE leaves")

	require.NoError(t, d.Migrate(ctx))
	var n int
	require.NoError(t, d.DB().QueryRow(`SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+` WHERE version_id = 1`).Scan(&n))
	require.Equal(t, 1, n)
	_, err = d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
}

// A process killed between 00002's ALTER TABLE (which MySQL commits on its
// own) and goose's record of version 2 leaves the owner column without its
// version row. The next start migrates: the column found, version 2 is
// recorded instead of added again (Error 1060 "Duplicate column name").
func TestMigrateAfterOwnerColumnAddedButNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := open(t, "")
	_, err := d.DB().ExecContext(ctx, `DELETE FROM `+idemmysql.SchemaVersionTable+` WHERE version_id = 2`)
	require.NoError(t, err)

	require.NoError(t, d.Migrate(ctx), "a start after the kill")
	var n int
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+`
		WHERE version_id = 2 AND is_applied`).Scan(&n))
	require.Equal(t, 1, n, "version 2 recorded once")
	list, err := d.MigrationStatus(ctx)
	require.NoError(t, err)
	for _, m := range list {
		require.True(t, m.Applied, "%+v", m)
		require.Empty(t, m.Missing, "%+v", m)
	}
	require.NoError(t, d.Migrate(ctx), "and every start after it")
}

// The same for 00003 (seal_key), 00004 (request) and 00005 (seal_tag),
// each one ALTER TABLE that MySQL commits on its own: a kill before goose
// recorded the version leaves the column; the next start records the
// version instead of failing on a duplicate column.
func TestMigrateAfterSealColumnsAddedButNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := open(t, "")
	_, err := d.DB().ExecContext(ctx, `DELETE FROM `+idemmysql.SchemaVersionTable+` WHERE version_id IN (3, 4, 5)`)
	require.NoError(t, err)
	require.NoError(t, d.Migrate(ctx), "a start after the kill")
	var n int
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+`
		WHERE version_id IN (3, 4, 5) AND is_applied`).Scan(&n))
	require.Equal(t, 3, n, "versions 3, 4 and 5 recorded once each")
}

// migrationsUpTo is the embedded migrations up to version last (its first
// last files).
func migrationsUpTo(t *testing.T, last int) fstest.MapFS {
	t.Helper()
	names, err := fs.Glob(idemmysql.EmbeddedMigrations(), "*.sql")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(names), last)
	set := fstest.MapFS{}
	for _, name := range names[:last] {
		data, err := fs.ReadFile(idemmysql.EmbeddedMigrations(), name)
		require.NoError(t, err)
		set[name] = &fstest.MapFile{Data: data}
	}
	return set
}

// Rolling deploys (docs/contract.md section 11.3): a database at version 6
// keeps its step rows through 00007 and 00008, and until they are applied
// the step statements refuse with ErrSchemaTooOld, writing nothing:
// StartStep at version 6 (no at_most_once column), MarkUnknown at version 7
// (the CHECK constraint knows no UNKNOWN). Their Down migrations undo them,
// 00008's refusing while a record is UNKNOWN.
func TestMigrateStepsToUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openUnmigrated(t, "")
	require.NoError(t, idemmysql.MigrateFS(d, ctx, migrationsUpTo(t, 6)))
	res, err := d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
	rec := res.Record
	_, err = d.DB().ExecContext(ctx, "INSERT INTO idem_steps (scope, `key`, created_at, name, started_token, started_at, relay, done, result, finished_at)\n"+
		"SELECT scope, `key`, created_at, 'charge', fencing_token, UTC_TIMESTAMP(6), 'relay', TRUE, 'ch_1', UTC_TIMESTAMP(6) FROM idem_keys")
	require.NoError(t, err, "a step of version 6")

	step := func(name string) idemdriver.StepParams {
		return idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: name}
	}
	for _, amo := range []bool{true, false} {
		_, err = d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step("transfer"), Relay: []byte("r"), AtMostOnce: amo})
		require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "at-most-once %v", amo)
	}
	_, err = d.Steps(ctx, step(""))
	require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld)
	var n int
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM idem_steps`).Scan(&n))
	require.Equal(t, 1, n, "nothing written")

	require.NoError(t, idemmysql.MigrateFS(d, ctx, migrationsUpTo(t, 7)))
	s, err := d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step("transfer"), Relay: []byte("r"), AtMostOnce: true})
	require.NoError(t, err)
	require.True(t, s.AtMostOnce)
	unknown := idemdriver.UnknownParams{StepParams: step("transfer"), Reason: idemdriver.ReasonStepUncertain}
	require.ErrorIs(t, d.MarkUnknown(ctx, unknown), idemdriver.ErrSchemaTooOld, "version 7 knows no UNKNOWN")
	got, err := d.Get(ctx, idemdriver.GetParams{Scope: rec.Scope, Key: rec.Key})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateProcessing, got.State, "nothing written")

	require.NoError(t, d.Migrate(ctx))
	list, err := d.Steps(ctx, step(""))
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "charge", list[0].Name, "version 6's row is kept")
	require.True(t, list[0].Done)
	require.Equal(t, "ch_1", string(list[0].Result))
	require.False(t, list[0].AtMostOnce)
	require.Empty(t, list[0].Reason)
	require.True(t, list[0].ResolvedAt.IsZero())

	require.NoError(t, d.MarkUnknown(ctx, unknown))
	got, err = d.Get(ctx, idemdriver.GetParams{Scope: rec.Scope, Key: rec.Key})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateUnknown, got.State)
	recs, err := d.List(ctx, idemdriver.ListParams{State: idemdriver.StateUnknown, Limit: 10})
	require.NoError(t, err)
	require.Len(t, recs, 1)

	_, err = d.MigrateDown(ctx)
	require.Error(t, err, "00008's Down refuses while a record is UNKNOWN")
	require.NoError(t, d.ResolveStep(ctx, idemdriver.ResolveStepParams{StepParams: step("transfer"), Applied: true,
		Result: []byte("tr_1"), By: "ops", Why: "the bank's statement", Retention: retention}))
	for _, version := range []int64{8, 7} {
		m, err := d.MigrateDown(ctx)
		require.NoError(t, err)
		require.Equal(t, version, m.Version)
	}
	_, err = d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step("transfer"), Relay: []byte("r")})
	require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "back at version 6")
	require.NoError(t, d.Migrate(ctx), "and up again")
	list, err = d.Steps(ctx, step(""))
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.True(t, list[1].Done, "the resolved result is kept through Down and Up")
	require.False(t, list[1].AtMostOnce, "its resolution columns are not")
}

// The completer's read needs idem_steps (00006): before it, it refuses
// with ErrSchemaTooOld.
func TestAbandonedSchemaTooOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openUnmigrated(t, "")
	require.NoError(t, idemmysql.MigrateFS(d, ctx, migrationsUpTo(t, 5)))
	_, _, err := d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 10})
	require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld)
	require.NoError(t, idemmysql.MigrateFS(d, ctx, migrationsUpTo(t, 6)))
	_, _, err = d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 10})
	require.NoError(t, err)
}

// The same for 00007 (the steps' columns) and 00008 (the UNKNOWN state):
// found in the schema, they are recorded, not run again; a schema without
// them is not taken for one with.
func TestMigrateAfterUnknownAddedButNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openUnmigrated(t, "")
	require.NoError(t, idemmysql.MigrateFS(d, ctx, migrationsUpTo(t, 6)))
	for _, version := range []int64{7, 8} {
		present, err := idemmysql.EmbeddedPresent(ctx, d.DB(), version)
		require.NoError(t, err)
		require.False(t, present, "version %d at version 6", version)
	}
	require.NoError(t, d.Migrate(ctx))
	for _, version := range []int64{7, 8} {
		present, err := idemmysql.EmbeddedPresent(ctx, d.DB(), version)
		require.NoError(t, err)
		require.True(t, present, "version %d", version)
	}
	_, err := d.DB().ExecContext(ctx, `DELETE FROM `+idemmysql.SchemaVersionTable+` WHERE version_id IN (7, 8)`)
	require.NoError(t, err)
	require.NoError(t, d.Migrate(ctx), "a start after the kill")
	var n int
	require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM `+idemmysql.SchemaVersionTable+`
		WHERE version_id IN (7, 8) AND is_applied`).Scan(&n))
	require.Equal(t, 2, n, "versions 7 and 8 recorded once each")
}
