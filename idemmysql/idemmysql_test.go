package idemmysql_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
)

// open returns a migrated driver on a fresh database, opened from the
// database's URL with extra query parameters appended.
func open(t testing.TB, params string) *idemmysql.Driver {
	t.Helper()
	d := openUnmigrated(t, params)
	require.NoError(t, d.Migrate(context.Background()))
	return d
}

// openUnmigrated is open without the migrations.
func openUnmigrated(t testing.TB, params string) *idemmysql.Driver {
	t.Helper()
	url, _ := dbtest.MySQLURL(t)
	if params != "" {
		url += sep(url) + params
	}
	d, err := idemmysql.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	urls.Store(d, url)
	return d
}

// urls maps the drivers of open to their database's URL, for secondDriver.
var urls sync.Map

// secondDriver returns a driver on d's database through a pool of its own,
// as another process would have. Unlike d's pool (Open's), it is a plain
// go-sql-driver pool given to New: no parseTime, no session settings. With
// IDEM_MYSQL_OTHER_NODES set (a Galera cluster), the second process uses
// the first other node, so the multi-process cases (two maintainers) run
// across nodes.
func secondDriver(t *testing.T, d idemdriver.Driver) idemdriver.Driver {
	t.Helper()
	url, ok := urls.Load(d)
	require.True(t, ok, "secondDriver needs a driver from open")
	cfg, err := idemmysql.ParseURL(url.(string))
	require.NoError(t, err)
	cfg.ParseTime, cfg.Params = false, nil
	if others := os.Getenv(EnvOtherNodes); others != "" {
		cfg.Addr = strings.TrimSpace(strings.Split(others, ",")[0])
		waitForDatabase(t, cfg.Clone())
	}
	c, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return idemmysql.New(db)
}

// fromConfig returns a driver (idemmysql.New) on a pool opened with cfg, and
// the pool; both close when the test ends.
func fromConfig(t *testing.T, cfg *mysql.Config) (*idemmysql.Driver, *sql.DB) {
	t.Helper()
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	d := idemmysql.New(db)
	t.Cleanup(func() { d.Close() })
	return d, db
}

// waitForDatabase waits until cfg's node has applied the CREATE DATABASE
// of another node.
func waitForDatabase(t *testing.T, cfg *mysql.Config) {
	t.Helper()
	c, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(c)
	defer db.Close()
	require.Eventually(t, func() bool { return db.Ping() == nil }, 10*time.Second, 20*time.Millisecond)
}

func sep(url string) string {
	for _, c := range url {
		if c == '?' {
			return "&"
		}
	}
	return "?"
}

func newDriver(t testing.TB) idemdriver.Driver { return open(t, "") }

// oneCommitFirst is the statement budget of a one-commit first execution:
// 5, and 7 on a Galera cluster (EnvOtherNodes set), whose won claims turn
// their session's autocommit off and back on (ClaimTx).
func oneCommitFirst() int {
	if os.Getenv(EnvOtherNodes) != "" {
		return 7
	}
	return 5
}

func TestConformance(t *testing.T) {
	idemdrivertest.Run(t, idemdrivertest.Harness{
		NewDriver: func(t *testing.T) idemdriver.Driver { return newDriver(t) },
		Unreachable: func(t *testing.T) idemdriver.Driver {
			db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none?timeout=2s")
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			return idemmysql.New(db)
		},
		Business: func(t *testing.T, d idemdriver.Driver) idemdrivertest.Business {
			db := d.(*idemmysql.Driver).DB()
			_, err := db.Exec(`CREATE TABLE business_rows (id VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB`)
			require.NoError(t, err)
			return dbtest.SQLBusiness{DB: db}
		},
		NewCountingDriver: func(t *testing.T) (idemdriver.Driver, func() int64) {
			wrap, n := counting()
			url, _ := dbtest.MySQLURL(t)
			d, err := idemmysql.OpenWrapped(context.Background(), url, wrap)
			require.NoError(t, err)
			t.Cleanup(func() { d.Close() })
			require.NoError(t, d.Migrate(context.Background()))
			return d, n.Load
		},
		// MySQL has no RETURNING: a first execution reads, then inserts,
		// then completes. Replays, 409 and 422 are answered by the read.
		// A completion in the claim's transaction adds START TRANSACTION and
		// COMMIT (Open's sessions default to READ COMMITTED, so no SET
		// TRANSACTION).
		// On Galera a won one-commit claim adds SET autocommit = 0 and = 1.
		Budget:       map[string]int{"first": 3, "first-claim-tx": 5, "first-one-commit": oneCommitFirst(), "replay-one-commit": 3, "replay": 1, "in-flight": 1, "key-reused": 1},
		SingleWriter: false,
		Maintenance:  true,
		Dump: func(t *testing.T, d idemdriver.Driver) [][]byte {
			return dbtest.DumpSQL(t, d.(*idemmysql.Driver).DB(), "idem_keys")
		},
		Tamper: func(t *testing.T, d idemdriver.Driver, scope, key string, set map[string]any) {
			dbtest.TamperSQL(t, d.(*idemmysql.Driver).DB(), scope, key, set)
		},
		SecondDriver: secondDriver,
		MultiMaster:  os.Getenv(EnvOtherNodes) != "",
		Starve:       starve,
	})
}

// starve is Harness.Starve: it bounds d's pool to two connections and takes
// both.
func starve(t *testing.T, d idemdriver.Driver) func() {
	db := d.(*idemmysql.Driver).DB()
	db.SetMaxOpenConns(2)
	var conns []*sql.Conn
	for range 2 {
		c, err := db.Conn(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			_ = c.Close()
		}
		db.SetMaxOpenConns(idemmysql.DefaultMaxOpenConns)
	}
}
