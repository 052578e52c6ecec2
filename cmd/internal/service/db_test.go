package service

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/dburl"
	"github.com/idemgo/idem/internal/dbtest"
)

// testSchema has one migration per kind, creating the table things.
var testSchema = Schema{
	Service:      "svctest",
	VersionTable: "svctest_schema_version",
	Migrations: fstest.MapFS{
		"migrations/postgres/00001_things.sql": {Data: []byte("-- +goose Up\nCREATE TABLE things (id text PRIMARY KEY);\n-- +goose Down\nDROP TABLE things;\n")},
		"migrations/mysql/00001_things.sql":    {Data: []byte("-- +goose Up\nCREATE TABLE things (id varchar(64) PRIMARY KEY);\n-- +goose Down\nDROP TABLE things;\n")},
		"migrations/sqlite/00001_things.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE things (id TEXT PRIMARY KEY);\n-- +goose Down\nDROP TABLE things;\n")},
	},
}

func TestParseDatabaseURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"":                       {dburl.SQLite, "default.db"},
		"x.db":                   {dburl.SQLite, "x.db"},
		"sqlite:///tmp/x.db":     {dburl.SQLite, "/tmp/x.db"},
		"postgres://u@h/db?a=b":  {dburl.Postgres, "postgres://u@h/db?a=b"},
		"mysql://root@h:3306/db": {dburl.MySQL, "mysql://root@h:3306/db"},
	} {
		kind, target, err := ParseDatabaseURL(in, "default.db")
		require.NoError(t, err, in)
		require.Equal(t, want, [2]string{kind, target}, in)
	}
	for _, bad := range []string{"sqlserver://h/db", "sqlite:", "x.db?mode=ro"} {
		_, _, err := ParseDatabaseURL(bad, "default.db")
		require.Error(t, err, bad)
	}
}

func TestDescribeDatabase(t *testing.T) {
	t.Parallel()
	require.Equal(t, "sqlite:/tmp/x.db", DescribeDatabase(dburl.SQLite, "/tmp/x.db"))
	require.Equal(t, "postgres://u:xxxxx@h/db?search_path=s",
		DescribeDatabase(dburl.Postgres, "postgres://u:secret@h/db?search_path=s"))
	require.Equal(t, "mysql://root:xxxxx@h:3306/db", DescribeDatabase(dburl.MySQL, "mysql://root:secret@h:3306/db"))
	require.Equal(t, "postgres", DescribeDatabase(dburl.Postgres, "postgres://u:secret@h/db\x7f"), "unparsable: the kind only")
}

// testOpen opens kind at target twice at once (replicas starting together:
// the migrations run once), checks the tables and the handles, and closes.
func testOpen(t *testing.T, kind, target string) {
	ctx := context.Background()
	dbs := make([]*DB, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range dbs {
		wg.Go(func() { dbs[i], errs[i] = Open(ctx, kind, target, testSchema) })
	}
	wg.Wait()
	for i, d := range dbs {
		require.NoError(t, errs[i])
		t.Cleanup(func() { d.Close() })
	}
	d := dbs[0]
	require.Equal(t, kind, d.Kind)
	require.NotNil(t, d.Idem())
	require.NoError(t, d.Ping(ctx))

	var things, versions int
	query := func(q string, dest *int) {
		t.Helper()
		if kind == dburl.Postgres {
			require.Nil(t, d.SQL)
			require.NoError(t, d.Pool.QueryRow(ctx, q).Scan(dest), q)
			return
		}
		require.Nil(t, d.Pool)
		require.NoError(t, d.SQL.QueryRowContext(ctx, q).Scan(dest), q)
	}
	query(`SELECT COUNT(*) FROM things`, &things)
	query(`SELECT COUNT(*) FROM svctest_schema_version WHERE version_id = 1`, &versions)
	require.Zero(t, things)
	require.Equal(t, 1, versions, "the service's migration, applied once, in its own version table")
	query(`SELECT COUNT(*) FROM idem_keys`, &things)
	query(`SELECT COUNT(*) FROM idem_schema_version`, &versions)
	require.Positive(t, versions, "idem's migrations, in idem's version table")

	require.NoError(t, d.Close())
	require.Error(t, d.Ping(ctx), "closed")
	again, err := Open(ctx, kind, target, testSchema)
	require.NoError(t, err, "migrating again is safe")
	require.NoError(t, again.Close())
}

func TestOpenSQLite(t *testing.T) {
	t.Parallel()
	testOpen(t, dburl.SQLite, filepath.Join(t.TempDir(), "s.db"))
}

func TestOpenPostgres(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	testOpen(t, dburl.Postgres, url)

	_, err := Open(context.Background(), dburl.Postgres, strings.Replace(url, "search_path=", "search_path=nosuch", 1), testSchema)
	require.ErrorContains(t, err, "search_path", "idem's migrations find it first")
	_, err = Open(context.Background(), dburl.Postgres, "postgres://nobody@127.0.0.1:1/x?connect_timeout=1", testSchema)
	require.ErrorContains(t, err, "postgres: ")
}

func TestOpenMySQL(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.MySQLURL(t)
	testOpen(t, dburl.MySQL, url)
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "e.db")

	noSQLite := testSchema
	noSQLite.Migrations = fstest.MapFS{"migrations/postgres/00001_things.sql": testSchema.Migrations.(fstest.MapFS)["migrations/postgres/00001_things.sql"]}
	_, err := Open(ctx, dburl.SQLite, path, noSQLite)
	require.ErrorContains(t, err, "svctest: migrations: ")

	broken := testSchema
	broken.Migrations = fstest.MapFS{"migrations/sqlite/00001_bad.sql": {Data: []byte("-- +goose Up\nCREATE TABLE (;\n")}}
	_, err = Open(ctx, dburl.SQLite, path, broken)
	require.ErrorContains(t, err, "svctest: migrate: ")

	_, err = Open(ctx, "oracle", "x", testSchema)
	require.Error(t, err)
}
