package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
)

// poolSize is the connection pool of every database: 32 connections,
// shared by idem and the handler.
const poolSize = 32

// Database names accepted by --db.
const (
	dbPostgres = "postgres"
	dbMariaDB  = "mariadb"
	dbSQLite   = "sqlite"
)

// allDatabases is --db's default, in the order of the report.
var allDatabases = []string{dbPostgres, dbMariaDB, dbSQLite}

// bizTx is a business transaction on any of the three databases: pgx.Tx or
// *sql.Tx.
type bizTx interface {
	exec(ctx context.Context, query string, args ...any) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}
func (t pgxTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, q, args...)
	return err
}
func (t sqlTx) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.tx.Rollback() }

// target is one database under test: idem's driver on it, the business
// tables, and "the floor" (the statements idem needs, sent by hand).
type target struct {
	slug    string // postgres, mariadb, sqlite (--db)
	name    string // PostgreSQL, MariaDB, SQLite
	version string // the server's version string

	store idem.Store

	// begin starts a business transaction of the handler's own on the
	// pool idem uses.
	begin func(ctx context.Context) (bizTx, error)
	// claimTx returns the claim's transaction (idem.Tx[pgx.Tx], idem.Tx[*sql.Tx],
	// idem.Tx[*sql.Tx]) from a protected handler's context.
	claimTx func(ctx context.Context) (bizTx, error)

	// insertPayment takes id, merchant, amount, currency, customer,
	// description, created_at (µs); insertLedger takes payment_id, merchant,
	// amount, created_at (µs).
	insertPayment, insertLedger string

	// floorClaim inserts the PROCESSING record of a new key: in tx, or,
	// with tx nil, in a statement of its own (committed before the handler
	// runs, as idem's durable claim); false when the key exists.
	floorClaim func(ctx context.Context, tx bizTx, scope, key, path string, fingerprint []byte) (bool, error)
	// floorComplete records the response in tx, by primary key and
	// fencing token, as idem's completion in the business transaction.
	floorComplete func(ctx context.Context, tx bizTx, scope, key string, status int, headers, body []byte) error
	// floorRead reads a key's record by primary key with one prepared
	// SELECT of the columns any answer to an existing key needs (state,
	// fingerprint, stored response): the replay floor's statement. found is
	// false when the key has no record.
	floorRead func(ctx context.Context, scope, key string) (rec floorRecord, found bool, err error)
	// contractRead is floorRead as the contract floor needs it
	// (floorContract): the record only while it lives (expires_at after the
	// database's now; an expired key is new, CONTRACT section 9), with its
	// expires_at for the Idempotency-Key-Expires header.
	contractRead func(ctx context.Context, scope, key string) (rec floorRecord, found bool, err error)

	// fill writes records completed records and inFlight PROCESSING ones
	// (under a live lease) into idem_keys, then vacuums and analyzes it
	// (PostgreSQL only; nil elsewhere); filled describes the table after.
	fill   func(ctx context.Context, records, inFlight int) (string, error)
	filled string

	// close closes the pool and drops the run's place (schema, database
	// or file).
	close func() error
}

// floorRecord is what floorRead reads of a record.
type floorRecord struct {
	state         string
	fingerprint   []byte
	status        int // 0 before the completion
	headers, body []byte
	expires       time.Time // contractRead only
}

// floorSelect is the replay floor's statement, with the placeholders
// ("$1, $2" or "?, ?") and the key column's name (key is reserved on MariaDB)
// filled in.
func floorSelect(keyColumn, p1, p2 string) string {
	return `SELECT state, fingerprint, coalesce(response_status, 0), response_headers, response_body
		FROM idem_keys WHERE scope = ` + p1 + ` AND ` + keyColumn + ` = ` + p2
}

// contractSelect is contractRead's statement: floorSelect's columns and
// expires, the record's expires_at as the driver scans it (µs since the
// epoch on MariaDB and SQLite, whose drivers read the column so), of a
// record whose expires_at is after now, the database's clock.
func contractSelect(keyColumn, p1, p2, expires, now string) string {
	return `SELECT state, fingerprint, coalesce(response_status, 0), response_headers, response_body, ` + expires + `
		FROM idem_keys WHERE scope = ` + p1 + ` AND ` + keyColumn + ` = ` + p2 + ` AND expires_at > ` + now
}

// sqlFloorRead is floorRead through a statement prepared once on db
// (database/sql keeps it prepared on each connection it runs on); with
// expires and now (contractSelect's), contractRead.
func sqlFloorRead(ctx context.Context, db *sql.DB, keyColumn, expires, now string) (func(ctx context.Context, scope, key string) (floorRecord, bool, error), error) {
	q := floorSelect(keyColumn, "?", "?")
	if expires != "" {
		q = contractSelect(keyColumn, "?", "?", expires, now)
	}
	st, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, scope, key string) (floorRecord, bool, error) {
		var rec floorRecord
		var err error
		if expires == "" {
			err = st.QueryRowContext(ctx, scope, key).Scan(&rec.state, &rec.fingerprint, &rec.status, &rec.headers, &rec.body)
		} else {
			var us int64
			err = st.QueryRowContext(ctx, scope, key).Scan(&rec.state, &rec.fingerprint, &rec.status, &rec.headers, &rec.body, &us)
			rec.expires = time.UnixMicro(us)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return rec, false, nil
		}
		return rec, err == nil, err
	}, nil
}

// openTarget opens, and lays out afresh, the database named slug. Each run
// owns its place: the PostgreSQL schema and the MariaDB database named
// place (dropped and created again), or an SQLite file in dir.
func openTarget(ctx context.Context, slug string, o options, dir string) (*target, error) {
	switch slug {
	case dbPostgres:
		return openPostgres(ctx, o.pgURL, o.place)
	case dbMariaDB:
		return openMariaDB(ctx, o.mysqlURL, o.place)
	case dbSQLite:
		return openSQLite(ctx, filepath.Join(dir, o.place+".db"))
	}
	return nil, fmt.Errorf("unknown database %q (want %s)", slug, strings.Join(allDatabases, ", "))
}

func openPostgres(ctx context.Context, rawURL, schema string) (*target, error) {
	ident := pgx.Identifier{schema}.Sanitize()
	var version string
	if err := pgAdmin(ctx, rawURL, func(admin *pgx.Conn) error {
		if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
			return err
		}
		return admin.QueryRow(ctx, "SHOW server_version").Scan(&version)
	}); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns, cfg.MinConns = poolSize, poolSize
	cfg.MaxConnLifetime, cfg.MaxConnIdleTime = 24*time.Hour, 24*time.Hour
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := prewarm(ctx, func(ctx context.Context) (func(), error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return c.Release, nil
	}); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	drop := func() error {
		pool.Close()
		return pgAdmin(context.Background(), rawURL, func(admin *pgx.Conn) error {
			_, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE")
			return err
		})
	}
	d := idempgx.New(pool)
	pgTypes := columnTypes{id: "text", name: "text", currency: "text", status: "text", text: "text", integer: "bigint", serial: "bigserial"}
	if err := layOut(ctx, "postgres", d, pgExec(pool), drop, pgTypes.ddl()...); err != nil {
		return nil, err
	}
	return &target{
		slug: dbPostgres, name: "PostgreSQL", version: "PostgreSQL " + version,
		store: d,
		begin: func(ctx context.Context) (bizTx, error) {
			tx, err := pool.Begin(ctx)
			return pgxTx{tx}, err
		},
		claimTx: func(ctx context.Context) (bizTx, error) {
			tx, err := idem.Tx[pgx.Tx](ctx)
			return pgxTx{tx}, err
		},
		insertPayment: `INSERT INTO bench_payments (id, merchant, amount, currency, customer, description, status, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7)`,
		insertLedger: `INSERT INTO bench_ledger (payment_id, merchant, amount, created_at) VALUES ($1, $2, $3, $4)`,
		floorClaim: func(ctx context.Context, tx bizTx, scope, key, path string, fp []byte) (bool, error) {
			var on interface {
				Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
			} = pool
			if tx != nil {
				on = tx.(pgxTx).tx
			}
			tag, err := on.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
				locked_until, created_at, updated_at, expires_at, attempts)
				VALUES ($1, $2, 'POST', $3, $4, 'PROCESSING', 1, now() + interval '30 seconds', now(), now(), now() + interval '1 day', 1)
				ON CONFLICT DO NOTHING`, scope, key, path, fp)
			return err == nil && tag.RowsAffected() == 1, err
		},
		floorComplete: func(ctx context.Context, tx bizTx, scope, key string, status int, headers, body []byte) error {
			return expectOneRow(tx.(pgxTx).tx.Exec(ctx, `UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,
				response_status = $3, response_headers = $4, response_body = $5, response_body_stored = true,
				response_body_size = $6, completed_at = now(), updated_at = now()
				WHERE scope = $1 AND key = $2 AND fencing_token = 1`, scope, key, status, headers, body, len(body)))
		},
		// pgx prepares the statement on each connection at its first use
		// and keeps it (the default exec mode, cache_statement).
		floorRead: func(ctx context.Context, scope, key string) (floorRecord, bool, error) {
			var rec floorRecord
			err := pool.QueryRow(ctx, pgFloorSelect, scope, key).Scan(&rec.state, &rec.fingerprint, &rec.status, &rec.headers, &rec.body)
			if errors.Is(err, pgx.ErrNoRows) {
				return rec, false, nil
			}
			return rec, err == nil, err
		},
		contractRead: func(ctx context.Context, scope, key string) (floorRecord, bool, error) {
			var rec floorRecord
			err := pool.QueryRow(ctx, pgContractSelect, scope, key).Scan(&rec.state, &rec.fingerprint, &rec.status, &rec.headers, &rec.body, &rec.expires)
			if errors.Is(err, pgx.ErrNoRows) {
				return rec, false, nil
			}
			return rec, err == nil, err
		},
		fill: func(ctx context.Context, records, inFlight int) (string, error) {
			return pgFill(ctx, pool, records, inFlight)
		},
		close: drop,
	}, nil
}

// pgFill is the PostgreSQL target's fill: the records under scope
// "filler" (never the benchmark's), each completed one with a 176-byte
// body as the handler's, in batches of a million; then VACUUM (ANALYZE) so
// that the run reads a settled table. It returns the table's size and its
// indexes', per million records.
func pgFill(ctx context.Context, pool *pgxpool.Pool, records, inFlight int) (string, error) {
	const batch = 1_000_000
	for from := 0; from < records; from += batch {
		to := min(from+batch, records)
		if _, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
			response_status, response_headers, response_body, response_body_stored, response_body_size,
			created_at, updated_at, completed_at, expires_at, attempts, owner)
			SELECT 'filler', 'done-' || g, 'POST', '/idem-tx/payments', sha256(g::text::bytea), 'SUCCEEDED', 1,
				201, convert_to('{"Content-Type":["application/json"],"Location":["/v1/payments/pay_' || g || '"]}', 'UTF8'),
				convert_to(rpad('{"id":"pay_' || g || '"', 175, ' ') || '}', 'UTF8'), true, 176,
				now(), now(), now(), now() + interval '1 day', 1, 'filler'
			FROM generate_series($1::bigint, $2::bigint) g`, from+1, to); err != nil {
			return "", fmt.Errorf("postgres: fill: %w", err)
		}
	}
	if inFlight > 0 {
		if _, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
			locked_until, created_at, updated_at, expires_at, attempts, owner)
			SELECT 'filler', 'busy-' || g, 'POST', '/idem-tx/payments', sha256(g::text::bytea), 'PROCESSING', 1,
				now() + interval '6 hours', now(), now(), now() + interval '1 day', 1, 'filler'
			FROM generate_series(1, $1::bigint) g`, inFlight); err != nil {
			return "", fmt.Errorf("postgres: fill: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) idem_keys`); err != nil {
		return "", fmt.Errorf("postgres: fill: %w", err)
	}
	var table, indexes int64
	if err := pool.QueryRow(ctx, `SELECT pg_table_size('idem_keys'), pg_indexes_size('idem_keys')`).Scan(&table, &indexes); err != nil {
		return "", fmt.Errorf("postgres: fill: %w", err)
	}
	n := records + inFlight
	per := func(b int64) string {
		return fmt.Sprintf("%.0f MiB per million records", float64(b)/(1<<20)/(float64(n)/1e6))
	}
	return fmt.Sprintf("idem_keys held %d completed records and %d in flight (scope \"filler\") before the run: "+
		"table %.0f MiB (%s), indexes %.0f MiB (%s; the primary key, expires_at and the partial index of the records in flight)",
		records, inFlight, float64(table)/(1<<20), per(table), float64(indexes)/(1<<20), per(indexes)), nil
}

var (
	pgFloorSelect    = floorSelect("key", "$1", "$2")
	pgContractSelect = contractSelect("key", "$1", "$2", "expires_at", "now()")
)

// pgAdmin runs f on a connection of its own to rawURL: f's error, else the
// close's.
func pgAdmin(ctx context.Context, rawURL string, f func(*pgx.Conn) error) error {
	c, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	err = f(c)
	return errors.Join(err, c.Close(context.Background()))
}

func pgExec(pool *pgxpool.Pool) func(context.Context, string) error {
	return func(ctx context.Context, q string) error { _, err := pool.Exec(ctx, q); return err }
}

func sqlExec(db *sql.DB) func(context.Context, string) error {
	return func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err }
}

// prewarm opens the pool's poolSize connections before the run, so that
// the measurement opens none (and a server shared with other work cannot
// refuse one midway, "too many clients"): it holds poolSize connections at
// once, then gives them back to the pool, which keeps them. A server that
// has no room is tried again for up to 3 minutes.
func prewarm(ctx context.Context, acquire func(context.Context) (release func(), err error)) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var (
			mu       sync.Mutex
			releases []func()
			firstErr error
			wg       sync.WaitGroup
		)
		for range poolSize {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				release, err := acquire(actx)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					firstErr = cmp.Or(firstErr, err)
					return
				}
				releases = append(releases, release)
			}()
		}
		wg.Wait()
		for _, release := range releases {
			release()
		}
		if firstErr == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("opening %d connections: %w", poolSize, firstErr)
		}
		time.Sleep(2 * time.Second)
	}
}

// columnTypes are a database's types for the business tables' columns:
// id a payment id, name a merchant or customer, currency and status their
// short codes, text a description, integer a 64-bit integer, serial an
// auto-increment primary key's type; options follows each CREATE TABLE.
type columnTypes struct{ id, name, currency, status, text, integer, serial, options string }

// ddl returns the CREATE TABLE statements of bench_payments and
// bench_ledger in these types.
func (c columnTypes) ddl() []string {
	return []string{
		"CREATE TABLE bench_payments (id " + c.id + " PRIMARY KEY, merchant " + c.name + " NOT NULL, amount " + c.integer +
			" NOT NULL, currency " + c.currency + " NOT NULL, customer " + c.name + " NOT NULL, description " + c.text +
			", status " + c.status + " NOT NULL, created_at " + c.integer + " NOT NULL)" + c.options,
		"CREATE TABLE bench_ledger (id " + c.serial + " PRIMARY KEY, payment_id " + c.id + " NOT NULL, merchant " + c.name +
			" NOT NULL, amount " + c.integer + " NOT NULL, created_at " + c.integer + " NOT NULL)" + c.options,
	}
}

// layOut migrates store to idem's schema, then creates the business tables
// with exec, one statement of ddl each. On failure it drops the target and
// returns the error (with drop's), prefixed by name ("postgres: migrate:
// ...", "postgres: ...").
func layOut(ctx context.Context, name string, store interface{ Migrate(context.Context) error },
	exec func(ctx context.Context, ddl string) error, drop func() error, ddl ...string) error {
	err := store.Migrate(ctx)
	if err != nil {
		err = fmt.Errorf("migrate: %w", err)
	}
	for _, q := range ddl {
		if err != nil {
			break
		}
		err = exec(ctx, q)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, errors.Join(err, drop()))
	}
	return nil
}

func expectOneRow(tag pgconn.CommandTag, err error) error {
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("the completion changed %d rows", tag.RowsAffected())
	}
	return err
}

func expectOneSQLRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n != 1 {
		err = fmt.Errorf("the completion changed %d rows", n)
	}
	return err
}

// sqlTarget is the part of a target on database/sql that MariaDB and
// SQLite share: business transactions begun on db (the pool idem uses),
// the claim's transaction from claimTx, the business statements with ?
// placeholders; the floor is each database's own.
func sqlTarget(slug, name, version string, store idem.Store, db *sql.DB,
	claimTx func(context.Context) (*sql.Tx, error), drop func() error) target {
	return target{
		slug: slug, name: name, version: version, store: store,
		begin: func(ctx context.Context) (bizTx, error) {
			tx, err := db.BeginTx(ctx, nil)
			return sqlTx{tx}, err
		},
		claimTx: func(ctx context.Context) (bizTx, error) {
			tx, err := claimTx(ctx)
			return sqlTx{tx}, err
		},
		insertPayment: `INSERT INTO bench_payments (id, merchant, amount, currency, customer, description, status, created_at)
			VALUES (?, ?, ?, ?, ?, ?, 'succeeded', ?)`,
		insertLedger: `INSERT INTO bench_ledger (payment_id, merchant, amount, created_at) VALUES (?, ?, ?, ?)`,
		close:        drop,
	}
}

// sqlOn is tx's *sql.Tx, or db when tx is nil.
func sqlOn(db *sql.DB, tx bizTx) interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
} {
	if tx != nil {
		return tx.(sqlTx).tx
	}
	return db
}

// withFloor returns t with its floor: floorClaim and floorComplete.
func (t target) withFloor(claim func(ctx context.Context, tx bizTx, scope, key, path string, fingerprint []byte) (bool, error),
	complete func(ctx context.Context, tx bizTx, scope, key string, status int, headers, body []byte) error) *target {
	t.floorClaim, t.floorComplete = claim, complete
	return &t
}

// mysqlAdmin runs f on a pool of its own to rawURL: f's error, else the
// close's.
func mysqlAdmin(ctx context.Context, rawURL string, f func(*sql.DB) error) error {
	admin, err := idemmysql.Open(ctx, rawURL)
	if err != nil {
		return err
	}
	err = f(admin.DB())
	return errors.Join(err, admin.Close())
}

// mysqlURLWithDB returns rawURL (mysql://user@host:port/db) naming db.
func mysqlURLWithDB(rawURL, db string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + db
	return u.String(), nil
}

func openMariaDB(ctx context.Context, rawURL, database string) (*target, error) {
	ident := "`" + strings.ReplaceAll(database, "`", "``") + "`"
	var version string
	if err := mysqlAdmin(ctx, rawURL, func(admin *sql.DB) error {
		_, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+ident)
		if err == nil {
			_, err = admin.ExecContext(ctx, "CREATE DATABASE "+ident)
		}
		if err == nil {
			err = admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	dropDB := func() error {
		return mysqlAdmin(context.Background(), rawURL, func(admin *sql.DB) error {
			_, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+ident)
			return err
		})
	}
	dbURL, err := mysqlURLWithDB(rawURL, database)
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	d, err := idemmysql.Open(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", errors.Join(err, dropDB()))
	}
	db := d.DB()
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	db.SetConnMaxLifetime(0)
	drop := func() error { return errors.Join(d.Close(), dropDB()) }
	if err := prewarm(ctx, func(ctx context.Context) (func(), error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		// Closing a *sql.Conn returns it to the pool, which keeps it: its
		// only error is ErrConnDone, for a connection closed twice.
		return func() { _ = c.Close() }, nil
	}); err != nil {
		return nil, fmt.Errorf("mariadb: %w", errors.Join(err, drop()))
	}
	mariaTypes := columnTypes{id: "VARCHAR(64)", name: "VARCHAR(255)", currency: "VARCHAR(3)", status: "VARCHAR(16)", text: "TEXT",
		integer: "BIGINT", serial: "BIGINT AUTO_INCREMENT", options: " ENGINE = InnoDB"}
	if err := layOut(ctx, "mariadb", d, sqlExec(db), drop, mariaTypes.ddl()...); err != nil {
		return nil, err
	}
	// Business transactions in READ COMMITTED: the sessions' default that
	// idemmysql.Open sets.
	t := sqlTarget(dbMariaDB, "MariaDB", "MariaDB "+strings.TrimSuffix(version, "-MariaDB"), d, db, idem.Tx[*sql.Tx], drop)
	if t.floorRead, err = sqlFloorRead(ctx, db, "`key`", "", ""); err == nil {
		t.contractRead, err = sqlFloorRead(ctx, db, "`key`", "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', expires_at)", "NOW(6)")
	}
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", errors.Join(err, drop()))
	}
	return t.withFloor(
		func(ctx context.Context, tx bizTx, scope, key, path string, fp []byte) (bool, error) {
			_, err := sqlOn(db, tx).ExecContext(ctx, "INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token,"+
				" locked_until, created_at, updated_at, expires_at, attempts)"+
				" VALUES (?, ?, 'POST', ?, ?, 'PROCESSING', 1, NOW(6) + INTERVAL 30 SECOND, NOW(6), NOW(6), NOW(6) + INTERVAL 1 DAY, 1)",
				scope, key, path, fp)
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 { // ER_DUP_ENTRY
				return false, nil
			}
			return err == nil, err
		},
		func(ctx context.Context, tx bizTx, scope, key string, status int, headers, body []byte) error {
			return expectOneSQLRow(tx.(sqlTx).tx.ExecContext(ctx, "UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,"+
				" response_status = ?, response_headers = ?, response_body = ?, response_body_stored = true,"+
				" response_body_size = ?, completed_at = NOW(6), updated_at = NOW(6)"+
				" WHERE scope = ? AND `key` = ? AND fencing_token = 1", status, headers, body, len(body), scope, key))
		},
	), nil
}

func openSQLite(ctx context.Context, path string) (*target, error) {
	if err := removeSQLite(path); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	d, err := idemsqlite.Open(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	db := d.DB()
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	drop := func() error { return errors.Join(d.Close(), removeSQLite(path)) }
	sqliteTypes := columnTypes{id: "TEXT", name: "TEXT", currency: "TEXT", status: "TEXT", text: "TEXT", integer: "INTEGER", serial: "INTEGER"}
	if err := layOut(ctx, "sqlite", d, sqlExec(db), drop, sqliteTypes.ddl()...); err != nil {
		return nil, err
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return nil, fmt.Errorf("sqlite: %w", errors.Join(err, drop()))
	}
	const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`
	// Business transactions BEGIN IMMEDIATE (idemsqlite.DSN).
	t := sqlTarget(dbSQLite, "SQLite", "SQLite "+version+" (modernc.org/sqlite, WAL, synchronous=FULL)", d, db, idem.Tx[*sql.Tx], drop)
	if t.floorRead, err = sqlFloorRead(ctx, db, "key", "", ""); err == nil {
		t.contractRead, err = sqlFloorRead(ctx, db, "key", "expires_at", sqliteNow)
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", errors.Join(err, drop()))
	}
	return t.withFloor(
		func(ctx context.Context, tx bizTx, scope, key, path string, fp []byte) (bool, error) {
			res, err := sqlOn(db, tx).ExecContext(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
				locked_until, created_at, updated_at, expires_at, attempts)
				VALUES (?, ?, 'POST', ?, ?, 'PROCESSING', 1, `+sqliteNow+` + 30000000, `+sqliteNow+`, `+sqliteNow+`,
				`+sqliteNow+` + 86400000000, 1) ON CONFLICT DO NOTHING`, scope, key, path, fp)
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 1, err
		},
		func(ctx context.Context, tx bizTx, scope, key string, status int, headers, body []byte) error {
			return expectOneSQLRow(tx.(sqlTx).tx.ExecContext(ctx, `UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,
				response_status = ?, response_headers = ?, response_body = ?, response_body_stored = 1,
				response_body_size = ?, completed_at = `+sqliteNow+`, updated_at = `+sqliteNow+`
				WHERE scope = ? AND key = ? AND fencing_token = 1`, status, headers, body, len(body), scope, key))
		},
	), nil
}

// removeSQLite removes the SQLite database at path with its -wal and -shm
// files; a file that does not exist is no error.
func removeSQLite(path string) error {
	var errs []error
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
