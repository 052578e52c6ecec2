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
