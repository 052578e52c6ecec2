package idemmysql

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

// Column bounds of the idem_keys table. Claim refuses longer values with an
// error wrapping ErrTooLong instead of letting MySQL truncate them.
const (
	MaxScopeBytes       = 255   // VARBINARY(255), part of the primary key
	MaxKeyBytes         = 255   // VARBINARY(255), part of the primary key
	MaxMethodBytes      = 255   // VARBINARY(255)
	MaxPathBytes        = 65535 // BLOB
	MaxFingerprintBytes = 65535 // BLOB
)

// Pool settings of the *sql.DB that Open creates. Change them with DB().
const (
	// DefaultMaxOpenConns bounds the connections Open's pool keeps to the
	// server (MySQL serves each with a thread; an unbounded burst of claims
	// must not become a burst of connections).
	DefaultMaxOpenConns = 16
	// DefaultConnMaxLifetime recycles Open's connections, below the server's
	// usual wait_timeout and the idle timeouts of proxies.
	DefaultConnMaxLifetime = 5 * time.Minute
	// DefaultDialTimeout applies when the URL sets no timeout parameter.
	DefaultDialTimeout = 10 * time.Second
)

// Driver implements idemdriver.Driver on a MySQL or MariaDB database.
type Driver struct {
	db    *sql.DB
	owned bool // Open created db, so Close closes it
	// renewDB is Renew's pool of one connection, beside db (Open); nil
	// renews on db (New).
	renewDB *sql.DB
	// beginOpts begin business transactions: READ COMMITTED, or nil when
	// Open made that the sessions' default.
	beginOpts *sql.TxOptions
	// leases is the lease table (idem_locks) of the migration and
	// maintenance locks.
	leases *idemmigrate.Leases
	// galeraMu guards galeraKnown and galeraPrefix, the lease table's
	// Prefix once read from the server (see leasePrefix).
	galeraMu     sync.Mutex
	galeraKnown  bool
	galeraPrefix string

	stmts [numStmts]preparedStmt

	// maxPacket is the server's max_allowed_packet in bytes, 0 until read
	// (see packetLimit).
	maxPacket atomic.Int64
}

var _ idemdriver.Driver = (*Driver)(nil)

// claimHooks observe the claims of every Driver in the process. They are
// nil in production: only this package's tests set them, once, before any
// claim runs (export_test.go).
var claimHooks struct {
	// resolved is told of each lost race or lock conflict that a claim
	// resolved by reading again, with its kind.
	resolved func(d *Driver, k kind)
	// beforeWrite runs between a claim's read and its write (tests line
	// racers up with it).
	beforeWrite func(d *Driver)
}

// noteResolved tells claimHooks.resolved of a conflict d's claim resolved.
func (d *Driver) noteResolved(k kind) {
	if h := claimHooks.resolved; h != nil {
		h(d, k)
	}
}

// ParseURL converts a URL of the form
//
//	mysql://user:password@host:port/dbname?param=value&...
//
// into the go-sql-driver/mysql configuration that Open uses. The scheme is
// mysql (mariadb is accepted as a synonym); user and password are
// percent-decoded; the port defaults to 3306; dbname, the database holding
// idem_keys, is required. Connections are TCP only: for a Unix socket, build
// a *sql.DB yourself and use New.
//
// Query parameters are go-sql-driver DSN parameters (tls, timeout,
// readTimeout, writeTimeout, charset, collation, maxAllowedPacket, ...); any
// other name is a session system variable set on every new connection
// (SET name = value; the value is SQL, so quote strings:
// time_zone=%27%2B00%3A00%27 for '+00:00').
//
// On top of what the URL says, ParseURL sets parseTime=true and loc=UTC (for
// the application's own queries; the driver depends on neither), a dial
// timeout of DefaultDialTimeout when timeout is absent, and these session
// variables unless the URL sets them:
//   - time_zone = '+00:00', so NOW() and TIMESTAMP columns in the
//     application's queries agree with UTC;
//   - sql_mode = the server's sql_mode plus STRICT_TRANS_TABLES, so a value
//     too long for its column is an error, never a silent truncation.
//
// The claim does not depend on the isolation level (see the package
// documentation); Open sets READ COMMITTED for business transactions. It
// does not set clientFoundRows either: the driver counts affected rows
// correctly with or without it.
func ParseURL(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: URL: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, fmt.Errorf("idemmysql: URL scheme %q: want mysql://user:password@host:port/dbname", u.Scheme)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return nil, errors.New("idemmysql: URL has no host: want mysql://user:password@host:port/dbname")
	}
	database, err := url.PathUnescape(u.EscapedPath())
	if err != nil {
		return nil, fmt.Errorf("idemmysql: URL path: %w", err)
	}
	if len(database) < 2 || database[0] != '/' || strings.Contains(database[1:], "/") {
		return nil, fmt.Errorf("idemmysql: URL path %q: want one database name, as in mysql://host:3306/dbname", database)
	}
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	// go-sql-driver parses its own parameters; credentials are set apart so
	// that any character may appear in them.
	cfg, err := mysql.ParseDSN("tcp(" + net.JoinHostPort(u.Hostname(), port) + ")/" + database[1:] + "?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: URL parameters: %w", err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultDialTimeout
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["time_zone"]; !ok {
		cfg.Params["time_zone"] = "'+00:00'"
	}
	if _, ok := cfg.Params["sql_mode"]; !ok {
		cfg.Params["sql_mode"] = "CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_TRANS_TABLES')"
	}
	return cfg, nil
}

// Open connects to the database named by url (see ParseURL for its form and
// the settings it adds), checks the connection, and returns a driver that
// owns the pool: Close closes it. The pool keeps at most
// DefaultMaxOpenConns connections, recycled after DefaultConnMaxLifetime.
// Call Migrate before use.
//
// Unless the URL sets transaction_isolation or tx_isolation itself, Open also
// makes READ COMMITTED the sessions' default isolation level, under the
// variable's name on the server at hand (transaction_isolation on MySQL 8 and
// MariaDB 11.1+, tx_isolation on older MariaDB), so that Begin need not send
// SET TRANSACTION before each business transaction.
//
// On a Galera node (wsrep_on ON) whose URL does not set wsrep_sync_wait,
// Open sets it to 1 for its sessions: each read waits until the node has
// applied every write set committed anywhere in the cluster before it began,
// so a claim on one node sees the outcome a request recorded a moment ago on
// another and replays it (without, a duplicate could get 409 from a stale
// PROCESSING row). It costs about a cluster round trip per read (see
// docs/deployment.md for the figure). wsrep_sync_wait=0 in the URL turns it off.
func Open(ctx context.Context, url string) (*Driver, error) { return open(ctx, url, nil) }

// open is Open with a hook that wraps the connector (tests count statements).
func open(ctx context.Context, url string, wrap func(driver.Connector) driver.Connector) (*Driver, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	_, ownIsolation := cfg.Params["transaction_isolation"]
	if _, ok := cfg.Params["tx_isolation"]; ok {
		ownIsolation = true
	}
	if ownIsolation {
		return openPool(ctx, cfg, "", wrap)
	}
	d, err := openPool(ctx, cfg, "transaction_isolation", wrap)
	if classify(err) == kindUnknownVariable {
		// MariaDB before 11.1 knows the variable as tx_isolation only.
		d, err = openPool(ctx, cfg, "tx_isolation", wrap)
	}
	return d, err
}

// openPool opens and pings a pool on cfg whose sessions set the isolation
// variable isolation (if not "") to READ COMMITTED.
func openPool(ctx context.Context, cfg *mysql.Config, isolation string, wrap func(driver.Connector) driver.Connector) (*Driver, error) {
	cfg = cfg.Clone()
	if isolation != "" {
		cfg.Params[isolation] = "'READ-COMMITTED'"
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: open: %w", err)
	}
	var dc driver.Connector = connector
	if wrap != nil {
		dc = wrap(dc)
	}
	db := sql.OpenDB(dc)
	db.SetMaxOpenConns(DefaultMaxOpenConns)
	db.SetMaxIdleConns(DefaultMaxOpenConns)
	db.SetConnMaxLifetime(DefaultConnMaxLifetime)
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("idemmysql: open %s@%s/%s: %w", cfg.User, cfg.Addr, cfg.DBName, errors.Join(err, db.Close()))
	}
	if _, set := cfg.Params["wsrep_sync_wait"]; !set {
		on, err := galera(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("idemmysql: open: reading wsrep_on: %w", errors.Join(err, db.Close()))
		}
		if on {
			// Every session of the pool must set wsrep_sync_wait: a new one.
			if err := db.Close(); err != nil {
				return nil, fmt.Errorf("idemmysql: open: closing the first pool of a Galera node: %w", err)
			}
			cfg.Params["wsrep_sync_wait"] = "1"
			return openPool(ctx, cfg, isolation, wrap)
		}
	}
	d := New(db)
	d.owned = true
	if _, err := d.packetLimit(ctx); err != nil {
		return nil, fmt.Errorf("idemmysql: open %s@%s/%s: %w", cfg.User, cfg.Addr, cfg.DBName, errors.Join(err, db.Close()))
	}
	if isolation != "" {
		d.beginOpts = nil // READ COMMITTED is the sessions' default already
	}
	d.renewDB = renewOpen(dc)
	return d, nil
}

// galera reports whether the server is a Galera node (wsrep_on is ON; MySQL
// has no such variable).
func galera(ctx context.Context, db *sql.DB) (bool, error) {
	var name, value string
	err := db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &value)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return strings.EqualFold(value, "ON"), err
}

// New returns a driver on an existing pool; idem_keys lives in the pool's
// default database. Call Migrate before use. Close releases the driver's
// prepared statements but leaves db open.
//
// The driver works whatever db's DSN says about parseTime, loc, time_zone,
// clientFoundRows and the isolation level: times cross as integers, every
// claim statement is its own transaction, business transactions set READ
// COMMITTED themselves (one SET TRANSACTION statement each), and fenced
// writes always change their row. It needs autocommit on (the server's and
// go-sql-driver's default) and a default database. A strict sql_mode is
// recommended for the application's sake; idem's own writes are
// bounds-checked in Go.
func New(db *sql.DB) *Driver {
	leases := idemmigrate.NewLeases(db, idemmigrate.MySQL, idemmigrate.DefaultLeaseTable)
	leases.Conflict = func(err error) bool { k := classify(err); return k == kindDeadlock || k == kindLockWait }
	d := &Driver{db: db, beginOpts: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, leases: leases}
	leases.Prefix = d.leasePrefix
	return d
}

// leaseSyncWait makes a statement on a lease row causal on MariaDB
// Galera: it first waits until the node has applied every write set
// committed in the cluster before it began (wsrep_sync_wait 15: reads,
// UPDATE and DELETE, INSERT and REPLACE, SHOW), whatever the session's
// wsrep_sync_wait (Open's 1 covers reads only; New's pool may set none).
// A lease moved on another node a moment ago is then seen on this one: a
// released lease is free at once and a lapsed one is taken over, on any
// node (see idemmigrate.Leases.Prefix).
const leaseSyncWait = "SET STATEMENT wsrep_sync_wait=15 FOR "

// leasePrefix is the lease table's Prefix: leaseSyncWait on a MariaDB
// Galera node, nothing elsewhere (MySQL has no SET STATEMENT; Percona
// XtraDB Cluster is not detected). The server is asked once (wsrep_on and
// the version); a failed read is tried again by the next statement.
func (d *Driver) leasePrefix(ctx context.Context) (string, error) {
	d.galeraMu.Lock()
	defer d.galeraMu.Unlock()
	if d.galeraKnown {
		return d.galeraPrefix, nil
	}
	var version string
	if err := d.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return "", fmt.Errorf("idemmysql: reading the server's version: %w", err)
	}
	on := false
	if strings.Contains(version, "MariaDB") {
		var err error
		if on, err = galera(ctx, d.db); err != nil {
			return "", fmt.Errorf("idemmysql: reading wsrep_on: %w", err)
		}
	}
	if on {
		d.galeraPrefix = leaseSyncWait
	}
	d.galeraKnown = true
	return d.galeraPrefix, nil
}

// DB returns the driver's pool, for the application's own queries.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the driver's prepared statements and, when Open created the
// pool, the pool.
func (d *Driver) Close() error {
	var errs []error
	for i := range d.stmts {
		errs = append(errs, d.stmts[i].close())
	}
	if d.owned {
		errs = append(errs, d.db.Close())
	}
	if d.renewDB != nil {
		errs = append(errs, d.renewDB.Close())
	}
	return errors.Join(errs...)
}

// SQL building blocks. Times cross between Go and MySQL as microseconds
// since the epoch; DATETIME(6) arithmetic on them is exact.
const (
	epoch = `TIMESTAMP'1970-01-01 00:00:00'`
	// now is the database clock moved by a ClockOffset parameter (µs).
	now = `(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`
	// at is the DATETIME(6) of a microseconds-since-epoch parameter.
	at = `(` + epoch + ` + INTERVAL ? MICROSECOND)`
	// clock is the database clock when the expression is evaluated, in UTC,
	// moved by a ClockOffset parameter (µs). UTC_TIMESTAMP and NOW are fixed
	// when the statement starts; SYSDATE is read when evaluated, so the time
	// a statement waited for a row lock is added to UTC_TIMESTAMP (both
	// differences are in the session's time zone, which cancels out). A
	// lease counts from when the claim's (or heartbeat's) write takes effect
	// and is never born expired. A server started with
	// --sysdate-is-now makes SYSDATE NOW, and leases count from the statement's
	// start again.
	clock = `(UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND + INTERVAL ? MICROSECOND)`
	// lockedUntil is the lease a takeover writes: at least the read's now +
	// the lease (the value Claim reports), counted from the write when it
	// waited for the row (the old owner's business transaction holds it).
	// Args: the read's now + lease (µs), offset, lease.
	lockedUntil = `GREATEST(` + at + `, ` + clock + ` + INTERVAL ? MICROSECOND)`
	// touch moves updated_at to now, or 1 µs past its old value when that is
	// later, so that a fenced write always changes its row (see "Fenced
	// writes" in the package documentation).
	touch = `updated_at = GREATEST(` + now + `, updated_at + INTERVAL 1 MICROSECOND)`
	// fenced names one owned execution. Args: scope, key, token, created_at (µs).
	fenced = " WHERE scope = ? AND `key` = ? AND fencing_token = ? AND created_at = " + at + " AND state = 'PROCESSING'"
)

func micros(col string) string { return `TIMESTAMPDIFF(MICROSECOND, ` + epoch + `, ` + col + `)` }

// nowTable is a one-row table n whose column now is the database clock
// moved by a ClockOffset parameter (µs): one now for a whole statement.
const nowTable = `(SELECT UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND AS now) AS n`

// recordColumns are the columns that scanSnapshot reads after the database's
// now: the record of idem_keys AS k, then its lease left against n.now.
var recordColumns = `k.scope, k.` + "`key`" + `, k.method, k.path, k.fingerprint, k.state, k.fencing_token,
	` + micros(`k.locked_until`) + `, k.response_status, k.response_headers, k.response_body,
	k.response_body_stored, k.response_body_size, k.seal_key, k.seal_tag,
	` + micros(`k.created_at`) + `, ` + micros(`k.updated_at`) + `, ` + micros(`k.completed_at`) + `,
	` + micros(`k.expires_at`) + `, k.attempts, k.owner,
	TIMESTAMPDIFF(MICROSECOND, n.now, k.locked_until)`

type stmtID int

const (
	stRead stmtID = iota
	stInsert
	stTakeover
	stHeartbeat
	stComplete
	stFail
	stRelease
	stPurgeSelect
	numStmts
)

var queries = [numStmts]string{
	// The record, if any, and the database's now. Args: offset, scope, key.
	stRead: `SELECT ` + micros(`n.now`) + `, ` + recordColumns + `
FROM ` + nowTable + `
LEFT JOIN idem_keys AS k ON k.scope = ? AND k.` + "`key`" + ` = ?`,

	// A new key. Args: scope, key, method, path, fingerprint, locked_until,
	// created_at, updated_at, expires_at (µs), owner. The lease counts from
	// the read: an INSERT waits only behind another transaction's
	// uncommitted INSERT of the same key, which idem's autocommit claims
	// never leave open, so the row it writes is exactly the one Claim reports.
	stInsert: "INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token,\n" +
		"	locked_until, created_at, updated_at, expires_at, attempts, owner)\n" +
		"VALUES (?, ?, ?, ?, ?, 'PROCESSING', 1, " + at + ", " + at + ", " + at + ", " + at + ", 1, ?)",

	// The compare-and-set on a claimable row: the token, created_at and
	// state pin the version that was read (the token alone does not: a
	// completion keeps it, and a purged key starts again at 1), and with it
	// the request it holds and the decision made on it; the claimable
	// condition is checked again against the same now: no live lease (a
	// heartbeat may have renewed it since the read), and either expired or
	// unfinished. Args: method, path, fingerprint, owner, locked_until (3),
	// updated_at, created_at, expires_at (µs), attempts, scope, key, token,
	// the created_at read (µs), the state read, now, now (µs).
	stTakeover: `UPDATE idem_keys SET method = ?, path = ?, fingerprint = ?, owner = ?, state = 'PROCESSING',
	fencing_token = fencing_token + 1, locked_until = ` + lockedUntil + `,
	response_status = NULL, response_headers = NULL, response_body = NULL,
	response_body_stored = NULL, response_body_size = NULL, seal_key = '', seal_tag = NULL, request = NULL, completed_at = NULL,
	updated_at = ` + at + `, created_at = ` + at + `, expires_at = ` + at + `, attempts = ?
WHERE scope = ? AND ` + "`key`" + ` = ? AND fencing_token = ? AND created_at = ` + at + ` AND state = ?
	AND (state <> 'PROCESSING' OR locked_until <= ` + at + `) AND (expires_at <= ` + at + ` OR state <> 'SUCCEEDED')`,

	// Args: offset, lease, offset, scope, key, token.
	stHeartbeat: `UPDATE idem_keys SET locked_until = ` + clock + ` + INTERVAL ? MICROSECOND, ` + touch + fenced,

	// Args: status, headers, body, stored, size, seal key, seal tag,
	// request, offset, offset, scope, key, token.
	stComplete: `UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,
	response_status = ?, response_headers = ?, response_body = ?,
	response_body_stored = ?, response_body_size = ?, seal_key = ?, seal_tag = ?, request = ?,
	completed_at = ` + now + `, ` + touch + fenced,

	// Args: offset, scope, key, token.
	stFail: `UPDATE idem_keys SET state = 'FAILED', locked_until = NULL, ` + touch + fenced,

	// Args: scope, key, token.
	stRelease: `DELETE FROM idem_keys` + fenced,

	// One purge batch's records, locked (see purgeSelectSQL). Args: see purgeArgs.
	stPurgeSelect: purgeSelectSQL,
}

// preparedStmt is one statement, prepared on first use (MySQL checks the
// table at prepare time, and New runs before Migrate). database/sql then
// prepares it again on each pooled connection the first time it runs there.
type preparedStmt struct {
	mu   sync.Mutex
	stmt atomic.Pointer[sql.Stmt]
}

func (d *Driver) stmt(ctx context.Context, id stmtID) (*sql.Stmt, error) {
	ps := &d.stmts[id]
	if s := ps.stmt.Load(); s != nil {
		return s, nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if s := ps.stmt.Load(); s != nil {
		return s, nil
	}
	s, err := d.db.PrepareContext(ctx, queries[id])
	if err != nil {
		return nil, err
	}
	ps.stmt.Store(s)
	return s, nil
}

func (ps *preparedStmt) close() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	s := ps.stmt.Swap(nil)
	if s == nil {
		return nil
	}
	return s.Close()
}

// maxClaimTries bounds the rounds of read and write of one claim. Each
// round that does not answer means another claimant won in between (or
// InnoDB chose this one as a deadlock victim), so a few rounds suffice.
const maxClaimTries = 8

// ErrTooLong is wrapped by the error Claim returns for a scope, key, method,
// path, fingerprint or owner longer than its column (see MaxScopeBytes and
// the others), together with idemdriver.ErrUnstorable. Nothing is written.
var ErrTooLong = errors.New("idemmysql: value longer than its column")

func checkBounds(p idemdriver.ClaimParams) error {
	for _, f := range []struct {
		name string
		n    int
		max  int
	}{
		{"scope", len(p.Scope), MaxScopeBytes}, {"key", len(p.Key), MaxKeyBytes},
		{"method", len(p.Method), MaxMethodBytes}, {"path", len(p.Path), MaxPathBytes},
		{"fingerprint", len(p.Fingerprint), MaxFingerprintBytes},
		{"owner", len(p.Owner), idemdriver.MaxOwnerBytes},
	} {
		if f.n > f.max {
			return fmt.Errorf("%w (%w): %s is %d bytes, the column holds %d", ErrTooLong, idemdriver.ErrUnstorable, f.name, f.n, f.max)
		}
	}
	return nil
}

// snapshot is what the claim's read returned: the database's now and the
// record, if there is one.
type snapshot struct {
	nowUS       int64
	found       bool
	rec         idemdriver.Record
	lockedUS    sql.NullInt64
	expiresUS   int64
	createdUS   int64
	fingerprint []byte
}

// Claim implements idemdriver.Driver: a read, then an INSERT or a
// compare-and-set UPDATE when the record is claimable, each one autocommit
// statement; a lost race reads again (see the package documentation).
func (d *Driver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := checkBounds(p); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	offset := p.ClockOffset.Microseconds()
	var (
		lastErr    error
		lockWaited bool
	)
	for try := 0; try < maxClaimTries; try++ {
		snap, err := d.read(ctx, p.Scope, p.Key, offset)
		if err != nil {
			if k := classify(err); k != kindOther && ctx.Err() == nil {
				d.noteResolved(k)
				lastErr = err
				continue
			}
			return idemdriver.ClaimResult{}, err
		}
		dec := decide(snap, p)
		if snap.found && (!dec.Claims() || lockWaited) {
			// The row it lost to: a replay, a live lease, another request; or
			// a row that a transaction still holds (see lockWaited below).
			return idemdriver.ClaimResult{Record: snap.rec}, nil
		}
		if h := claimHooks.beforeWrite; h != nil {
			h(d)
		}
		var won bool
		var res idemdriver.ClaimResult
		if !snap.found {
			// (After a lock wait too: with no committed row there is nothing
			// to answer from. idem's own INSERTs commit at once, so only a
			// transaction of someone else's can hold an uncommitted key.)
			res, err = d.insert(ctx, nil, p, snap.nowUS)
			won = err == nil
		} else {
			res, won, err = d.takeover(ctx, nil, p, snap, dec.Continues())
			if err == nil && !won {
				d.noteResolved(kindRaced)
			}
		}
		if won {
			return res, nil
		}
		if err == nil {
			lastErr = errors.New("idemmysql: the compare-and-set lost to a concurrent write")
			continue
		}
		k := classify(err)
		if k == kindOther || ctx.Err() != nil {
			return idemdriver.ClaimResult{}, err
		}
		d.noteResolved(k)
		lastErr = err
		switch k {
		case kindLockWait:
			// A transaction held the row past innodb_lock_wait_timeout. If it
			// still looks claimable on the next read, that transaction has
			// not committed yet: answer from the row instead of waiting again.
			lockWaited = true
		case kindDeadlock, kindChanged:
			if err := sleepJitter(ctx); err != nil {
				return idemdriver.ClaimResult{}, err
			}
		}
	}
	return idemdriver.ClaimResult{}, fmt.Errorf("idemmysql: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

// decide is idemdriver.Decide on the snapshot: its record (nil when there
// is none), expired against the snapshot's now.
func decide(s snapshot, p idemdriver.ClaimParams) idemdriver.Decision {
	if !s.found {
		return idemdriver.Decide(nil, false, p)
	}
	return idemdriver.Decide(&s.rec, s.expiresUS <= s.nowUS, p)
}

func (d *Driver) read(ctx context.Context, scope, key string, offset int64) (snapshot, error) {
	s, err := d.stmt(ctx, stRead)
	if err != nil {
		return snapshot{}, err
	}
	return scanSnapshot(s.QueryRowContext(ctx, offset, scope, key))
}

func (d *Driver) insert(ctx context.Context, tx *sql.Tx, p idemdriver.ClaimParams, nowUS int64) (idemdriver.ClaimResult, error) {
	s, err := d.txStmt(ctx, tx, stInsert)
	if err != nil {
		return idemdriver.ClaimResult{}, err
	}
	lockedUS := nowUS + p.LeaseDuration.Microseconds()
	expiresUS := nowUS + p.Retention.Microseconds()
	if _, err := s.ExecContext(ctx, p.Scope, p.Key, p.Method, p.Path, p.Fingerprint,
		lockedUS, nowUS, nowUS, expiresUS, p.Owner); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	return claimed(p, 1, 1, nowUS, nowUS, expiresUS, lockedUS), nil
}

func (d *Driver) takeover(ctx context.Context, tx *sql.Tx, p idemdriver.ClaimParams, snap snapshot, continues bool) (idemdriver.ClaimResult, bool, error) {
	s, err := d.txStmt(ctx, tx, stTakeover)
	if err != nil {
		return idemdriver.ClaimResult{}, false, err
	}
	createdUS, attempts := snap.nowUS, 1 // a new life
	if continues {
		createdUS, attempts = snap.createdUS, snap.rec.Attempts+1
	}
	expiresUS := snap.nowUS + p.Retention.Microseconds()
	lockedUS := snap.nowUS + p.LeaseDuration.Microseconds()
	res, err := s.ExecContext(ctx, p.Method, p.Path, p.Fingerprint, p.Owner,
		lockedUS, p.ClockOffset.Microseconds(), p.LeaseDuration.Microseconds(),
		snap.nowUS, createdUS, expiresUS, attempts,
		p.Scope, p.Key, snap.rec.FencingToken, snap.createdUS, string(snap.rec.State), snap.nowUS, snap.nowUS)
	if err != nil {
		return idemdriver.ClaimResult{}, false, err
	}
	n, err := res.RowsAffected()
	if err != nil || n != 1 {
		return idemdriver.ClaimResult{}, false, err
	}
	// The UPDATE is fenced on the state read, so the state it replaced is
	// snap's.
	won := claimed(p, snap.rec.FencingToken+1, attempts, createdUS, snap.nowUS, expiresUS, lockedUS)
	won.TookOver = continues && snap.rec.State == idemdriver.StateProcessing
	return won, true, nil
}

// claimed is the record a won claim wrote. Its LockedUntil and LeaseLeft
// count the lease from the read: a lower bound of the lease written, which
// counts from the write (see lockedUntil).
func claimed(p idemdriver.ClaimParams, token int64, attempts int, createdUS, updatedUS, expiresUS, lockedUS int64) idemdriver.ClaimResult {
	locked := idemsql.MicrosTime(lockedUS)
	return idemdriver.ClaimResult{Claimed: true, Record: idemdriver.Record{
		Scope: p.Scope, Key: p.Key, Method: p.Method, Path: p.Path, Owner: p.Owner,
		Fingerprint: bytes.Clone(p.Fingerprint), State: idemdriver.StateProcessing,
		FencingToken: token, LeaseLeft: idemsql.LeaseLeft(idemdriver.StateProcessing, p.LeaseDuration, true),
		Attempts: attempts, CreatedAt: idemsql.MicrosTime(createdUS), UpdatedAt: idemsql.MicrosTime(updatedUS),
		ExpiresAt: idemsql.MicrosTime(expiresUS), LockedUntil: &locked,
	}}
}

// sleepJitter waits 1 to 5 ms before a deadlock victim tries again.
func sleepJitter(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Millisecond + rand.N(4*time.Millisecond)): // collected unstopped since Go 1.23
		return nil
	}
}

// getSQL is the claim's read (stRead) with the kept request, which a claim
// does not read. Args: offset, scope, key.
var getSQL = `SELECT ` + micros(`n.now`) + `, ` + recordColumns + `, k.request
FROM ` + nowTable + `
LEFT JOIN idem_keys AS k ON k.scope = ? AND k.` + "`key`" + ` = ?`

// Get implements idemdriver.Driver.
func (d *Driver) Get(ctx context.Context, p idemdriver.GetParams) (idemdriver.Record, error) {
	snap, err := scanWithRequest(d.db.QueryRowContext(ctx, getSQL, p.ClockOffset.Microseconds(), p.Scope, p.Key))
	if err != nil {
		return idemdriver.Record{}, err
	}
	if !snap.found {
		return idemdriver.Record{}, idemdriver.ErrNotFound
	}
	return snap.rec, nil
}

// Heartbeat implements idemdriver.Driver.
func (d *Driver) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	s, err := d.stmt(ctx, stHeartbeat)
	if err != nil {
		return false, err
	}
	off := p.ClockOffset.Microseconds()
	return execFenced(ctx, s, true, off, p.LeaseDuration.Microseconds(), off, p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro())
}

// Complete implements idemdriver.Driver.
func (d *Driver) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	return d.completeIn(ctx, nil, p)
}

// completeIn runs the fenced completion: on the pool when tx is nil,
// retried on a deadlock; otherwise in the business transaction tx, not
// retried: InnoDB has rolled the whole transaction back, the business
// writes with it, and the error reaches the core (which records FAILED,
// fenced, and answers 503; see idemdriver.Tx).
func (d *Driver) completeIn(ctx context.Context, tx *sql.Tx, p idemdriver.CompleteParams) (bool, error) {
	s, err := d.stmt(ctx, stComplete)
	if err != nil {
		return false, err
	}
	limit, err := d.packetLimit(ctx)
	if err != nil {
		return false, err
	}
	if tx != nil {
		return complete(ctx, tx.StmtContext(ctx, s), false, p, limit)
	}
	return complete(ctx, s, true, p, limit)
}

// Fail implements idemdriver.Driver.
func (d *Driver) Fail(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	s, err := d.stmt(ctx, stFail)
	if err != nil {
		return false, err
	}
	return execFenced(ctx, s, true, p.ClockOffset.Microseconds(), p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro())
}

// Release implements idemdriver.Driver: a fenced DELETE.
func (d *Driver) Release(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	s, err := d.stmt(ctx, stRelease)
	if err != nil {
		return false, err
	}
	return execFenced(ctx, s, true, p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro())
}

// Begin implements idemdriver.Driver: a transaction at READ COMMITTED, the
// level of idem's PostgreSQL driver, rather than MySQL's default REPEATABLE
// READ (whose gap locks make concurrent business inserts deadlock more
// often). On a pool from New, or when Open's URL sets an isolation level of
// its own, it sends SET TRANSACTION ISOLATION LEVEL READ COMMITTED before
// START TRANSACTION; otherwise READ COMMITTED is already the session's
// default (see Open). The fenced completion inside is correct at any level:
// an UPDATE always reads the latest committed row.
//
// A protected handler gets this transaction with
// idem.Tx[*sql.Tx](r.Context()), beginning it on first use (READ COMMITTED,
// see Driver.Begin). Do the business writes in it and leave Commit and
// Rollback to idem: the completion is written in the same transaction,
// fenced by the token, and committed with it (CONTRACT section 6).
//
// Never swallow an error of a statement in it: after a deadlock (1213), or a
// lock wait timeout (1205) with innodb_rollback_on_timeout, InnoDB has
// rolled the whole transaction back and the session is in autocommit, so a
// handler that answers 2xx anyway would have idem's completion commit alone,
// without the business writes. Return a 5xx (FAILED: the retry runs again).
func (d *Driver) Begin(ctx context.Context) (idemdriver.Tx, error) {
	tx, err := d.db.BeginTx(ctx, d.beginOpts)
	if err != nil {
		return nil, err
	}
	return d.sqlTx(tx), nil
}

// sqlTx is tx as the core's Tx: its completion is completeIn, and an error
// 1213 of the completion or the COMMIT wraps idemdriver.ErrConflict.
func (d *Driver) sqlTx(tx *sql.Tx) *idemsql.SQLTx {
	return &idemsql.SQLTx{Tx: tx, CompleteIn: d.completeIn, Conflict: aborted}
}

// packetOverhead is what a completion's packet carries besides the
// response's headers and body (its other arguments, the protocol's
// framing), with room to spare.
const packetOverhead = 4 << 10

// packetLimit returns the server's max_allowed_packet in bytes: the largest
// packet the server accepts, and so the largest completion it can store and
// send back on a replay. Open reads it; a driver from New reads it on its
// first completion. A change of the global value after that is seen by
// drivers opened later.
func (d *Driver) packetLimit(ctx context.Context) (int64, error) {
	if n := d.maxPacket.Load(); n > 0 {
		return n, nil
	}
	var n int64
	if err := d.db.QueryRowContext(ctx, `SELECT @@max_allowed_packet`).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemmysql: read max_allowed_packet: %w", err)
	}
	d.maxPacket.Store(n)
	return n, nil
}

// complete writes the completion with s. A completion that does not fit in
// the server's max_allowed_packet (limit) loses first its kept request, then
// its body: recorded as not stored (BodyStored false, BodySize kept; a
// plain response's headers dropped too when they alone do not fit, a
// sealed one's blob dropped whole, its headers with it, and its seal tag
// replaced by SealTagDropped, the tag of the response so stored). The server would
// refuse the write, the core would answer 503, and every retry would run
// the handler again. The replay answers 410 response-not-stored instead.
func complete(ctx context.Context, s *sql.Stmt, retry bool, p idemdriver.CompleteParams, limit int64) (bool, error) {
	resp := p.Response
	headers, body, err := idemsql.EncodeResponse(resp)
	if err != nil {
		return false, err
	}
	fits := func(n ...int) bool {
		total := int64(packetOverhead)
		for _, v := range n {
			total += int64(v)
		}
		return total <= limit
	}
	if !fits(len(headers), len(body), len(resp.Request)) {
		resp.Request = nil
	}
	if !fits(len(headers), len(body)) {
		resp.BodyStored, resp.Sealed, resp.SealTag = false, nil, resp.SealTagDropped
		if !fits(len(headers)) {
			resp.Header = nil
		}
		if headers, body, err = idemsql.EncodeResponse(resp); err != nil {
			return false, err
		}
	}
	off := p.ClockOffset.Microseconds()
	return execFenced(ctx, s, retry, resp.Status, headers, body, resp.BodyStored, resp.BodySize, resp.SealKey, resp.SealTag, resp.Request,
		off, off, p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro())
}

// execFenced runs a compare-and-set on the fencing token; false means the
// caller no longer owns the record. Outside a transaction (retry), a
// deadlock or a changed-record error runs the statement again.
func execFenced(ctx context.Context, s *sql.Stmt, retry bool, args ...any) (bool, error) {
	for try := 1; ; try++ {
		res, err := s.ExecContext(ctx, args...)
		if err != nil {
			k := classify(err)
			if retry && (k == kindDeadlock || k == kindChanged) && try < maxClaimTries && ctx.Err() == nil {
				if err := sleepJitter(ctx); err != nil {
					return false, err
				}
				continue
			}
			return false, err
		}
		n, err := res.RowsAffected()
		return n == 1, err
	}
}

type rowScanner interface{ Scan(dest ...any) error }

// scanWithRequest is scanSnapshot of a row followed by the request column
// (getSQL, listSQL), the request in the record's response.
func scanWithRequest(row rowScanner) (snapshot, error) {
	var request []byte
	s, err := scanSnapshot(row, &request)
	s.rec = idemsql.WithRequest(s.rec, request)
	return s, err
}

// scanSnapshot reads a row of the database's now and recordColumns, then
// extra.
func scanSnapshot(row rowScanner, extra ...any) (snapshot, error) {
	var (
		s                                        snapshot
		scope, key, method, path, state, owner   sql.NullString
		token, createdAt, updatedAt, completedAt sql.NullInt64
		expiresAt, attempts, leaseLeft           sql.NullInt64
		resp                                     idemsql.ResponseColumns
	)
	var sealKey sql.NullString // NULL when there is no record (the LEFT JOIN)
	dest := append([]any{&s.nowUS, &scope, &key, &method, &path, &s.fingerprint, &state, &token,
		&s.lockedUS, &resp.Status, &resp.Headers, &resp.Body, &resp.Stored, &resp.Size, &sealKey, &resp.SealTag,
		&createdAt, &updatedAt, &completedAt, &expiresAt, &attempts, &owner, &leaseLeft}, extra...)
	err := row.Scan(dest...)
	resp.SealKey = sealKey.String
	if err != nil || !token.Valid {
		return s, err // no record when the fencing token (NOT NULL) is NULL
	}
	s.found = true
	s.expiresUS, s.createdUS = expiresAt.Int64, createdAt.Int64
	rec := idemdriver.Record{
		Scope: scope.String, Key: key.String, Method: method.String, Path: path.String, Owner: owner.String,
		Fingerprint: s.fingerprint, State: idemdriver.State(state.String), FencingToken: token.Int64,
		Attempts: int(attempts.Int64), CreatedAt: idemsql.MicrosTime(createdAt.Int64), UpdatedAt: idemsql.MicrosTime(updatedAt.Int64),
		ExpiresAt: idemsql.MicrosTime(expiresAt.Int64), CompletedAt: idemsql.NullMicrosTime(completedAt), LockedUntil: idemsql.NullMicrosTime(s.lockedUS),
	}
	rec.LeaseLeft = idemsql.LeaseLeft(rec.State, time.Duration(leaseLeft.Int64)*time.Microsecond, leaseLeft.Valid)
	rec.Response = idemsql.DecodeResponse(rec.State, resp)
	s.rec = rec
	return s, nil
}
