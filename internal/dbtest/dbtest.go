// Package dbtest gives each test its own database: a PostgreSQL schema, a
// MySQL/MariaDB database, or a SQLite file, dropped when the test ends, so
// tests run with t.Parallel().
//
// Server URLs come from the environment (TEST_DATABASE_URL for PostgreSQL,
// TEST_MYSQL_URL for MySQL/MariaDB).
// A missing URL skips the test locally and fails it when CI is set: under CI
// a database test never counts as passed without its database.
package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemsqlite"
)

// EnvPostgres names the variable holding the PostgreSQL test server's URL,
// for example postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const EnvPostgres = "TEST_DATABASE_URL"

// RequireURL returns the URL in the environment variable env. Without it the
// test is skipped, or failed when the CI variable is set.
func RequireURL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: database tests must run under CI", env)
		}
		t.Skipf("%s is not set; skipping (set it, or run scripts/test)", env)
	}
	return u
}

// Name returns a fresh identifier with prefix, safe as a schema or database name.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error: it crashes the program instead
	return prefix + "_" + hex.EncodeToString(b[:])
}

// PostgresURL creates a fresh schema on the TEST_DATABASE_URL server, drops
// it when the test ends, and returns the server URL with the schema as its
// search_path (for programs that take a URL), and the schema's name.
func PostgresURL(t testing.TB) (url, schema string) {
	t.Helper()
	base := RequireURL(t, EnvPostgres)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("dbtest: connect %s: %v", EnvPostgres, err)
	}
	defer func() { check(t, "close the connection", conn.Close(ctx)) }()
	schema = Name("idemtest")
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("dbtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Errorf("dbtest: drop schema %s: %v", schema, err)
			return
		}
		defer func() { check(t, "close the connection", conn.Close(context.Background())) }()
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dbtest: drop schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "search_path=" + schema, schema
}

// PostgresPool returns a pool on a fresh schema (see PostgresURL), closed
// when the test ends.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url, schema := PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close) // registered after the schema drop, so it runs first
	return pool
}

// SQLitePath returns the path of a fresh SQLite file in the test's temporary
// directory (removed when the test ends).
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "idem.db")
}

// EnvMySQL names the variable holding the MySQL/MariaDB test server's URL, in
// the form idemmysql.Open takes, for example mysql://root@127.0.0.1:3306/test.
const EnvMySQL = "TEST_MYSQL_URL"

// MySQLURL creates a fresh database (idemtest_<random>) on the TEST_MYSQL_URL
// server, drops it when the test ends, and returns the server URL with that
// database as its path (query parameters kept), and the database's name.
func MySQLURL(t testing.TB) (dbURL, database string) {
	t.Helper()
	base := RequireURL(t, EnvMySQL)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("dbtest: %s: %v", EnvMySQL, err)
	}
	admin := openMySQL(t, u, "")
	defer func() { check(t, "close the admin pool", admin.Close()) }()
	database = Name("idemtest")
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+database); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() {
		admin := openMySQL(t, u, "")
		defer func() { check(t, "close the admin pool", admin.Close()) }()
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+database); err != nil {
			t.Errorf("dbtest: drop database %s: %v", database, err)
		}
	})
	u.Path = "/" + database
	return u.String(), database
}

// MySQLDSN returns a go-sql-driver/mysql data source name for a fresh
// database (see MySQLURL), with parseTime=true and loc=UTC.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	dbURL, database := MySQLURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return mysqlConfig(t, u, database).FormatDSN()
}

// MySQLDB returns a *sql.DB on a fresh database (see MySQLDSN), closed when
// the test ends.
func MySQLDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", MySQLDSN(t))
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	db.SetMaxOpenConns(16)
	t.Cleanup(func() { check(t, "close the pool", db.Close()) }) // registered after the database drop, so it runs first
	return db
}

// mysqlConfig turns a mysql://user:pass@host:port/db?params URL into a
// go-sql-driver configuration on database.
func mysqlConfig(t testing.TB, u *url.URL, database string) *mysql.Config {
	t.Helper()
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	cfg, err := mysql.ParseDSN("tcp(" + net.JoinHostPort(u.Hostname(), port) + ")/" + database + "?" + u.RawQuery)
	if err != nil {
		t.Fatalf("dbtest: %s: %v", EnvMySQL, err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.ParseTime, cfg.Loc = true, time.UTC
	return cfg
}

// openMySQL opens a connection pool on database of the server at u
// ("" for none), for administration.
func openMySQL(t testing.TB, u *url.URL, database string) *sql.DB {
	t.Helper()
	c, err := mysql.NewConnector(mysqlConfig(t, u, database))
	if err != nil {
		t.Fatalf("dbtest: %s: %v", EnvMySQL, err)
	}
	return sql.OpenDB(c)
}

// SQLite returns a migrated SQLite store on a fresh file (see SQLitePath),
// closed when the test ends.
func SQLite(t testing.TB) *idemsqlite.Driver {
	t.Helper()
	d, err := idemsqlite.Open(context.Background(), SQLitePath(t))
	if err != nil {
		t.Fatalf("dbtest: open SQLite: %v", err)
	}
	t.Cleanup(func() { check(t, "close SQLite", d.Close()) })
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("dbtest: migrate SQLite: %v", err)
	}
	return d
}

// check fails t (without stopping it) when err, what's error, is not nil.
func check(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("dbtest: %s: %v", what, err)
	}
}
