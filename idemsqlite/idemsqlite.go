// Package idemsqlite is idem's embedded SQLite driver: zero set-up, one
// file, no cgo (modernc.org/sqlite).
//
// SQLite has one writer at a time. Every transaction this package begins
// takes the write lock up front (BEGIN IMMEDIATE, through the _txlock=immediate
// connection setting) and every connection waits up to BusyTimeout for it, so
// concurrent requests queue instead of failing with SQLITE_BUSY; a BUSY that
// still surfaces is retried, then reported as a store error (503), never a 500.
// Times are integer microseconds since the Unix epoch from SQLite's clock
// (unixepoch('subsec'), millisecond resolution), which on an embedded database
// is the host's clock: every process sharing the file shares it.
package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

//go:embed migrations/*.sql
var migrations embed.FS

// BusyTimeout is how long a connection waits for SQLite's write lock before
// giving up with SQLITE_BUSY.
const BusyTimeout = 10 * time.Second

// SchemaVersionTable is the table in which the migration tool keeps the
// applied schema versions.
const SchemaVersionTable = "idem_schema_version"

// DSN returns the modernc.org/sqlite data source name idem needs for the
// file at path (any name: URI characters in it are escaped): WAL journal, BusyTimeout, synchronous=FULL,
// foreign keys (a record's steps go with it) and BEGIN IMMEDIATE for every transaction.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return "file:" + uriPath.Replace(path) + "?" + q.Encode()
}

// uriPath escapes the characters that end or escape the path of an SQLite
// URI filename (https://sqlite.org/uri.html), so any file name opens as is.
var uriPath = strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23")

// Open opens (creating if needed) the SQLite database file at path with the
// settings of DSN and returns a driver on it. Call Migrate before use. The
// driver owns the *sql.DB: Close closes it.
func Open(ctx context.Context, path string) (*Driver, error) {
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	// A new file's first connections switch it to WAL, which needs the
	// file to themselves: processes opening it at the same time can get
	// SQLITE_BUSY there, outside the busy timeout. Connect again, then.
	if err := retryBusy(ctx, func() error { return db.PingContext(ctx) }); err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, errors.Join(err, db.Close()))
	}
	return New(db), nil
}

// New returns a driver on db, which must have been opened with the settings
// of DSN (BEGIN IMMEDIATE transactions and a busy timeout above all).
// Statements are prepared on first use and kept for the driver's life.
func New(db *sql.DB) *Driver {
	maintenance := idemmigrate.NewLeases(db, idemmigrate.SQLite, "idem_maintenance_lock")
	maintenance.Migrated = true
	return &Driver{db: db, leases: idemmigrate.NewLeases(db, idemmigrate.SQLite, idemmigrate.DefaultLeaseTable),
		maintenance: maintenance}
}

// Driver implements idemdriver.Driver on one SQLite database file.
type Driver struct {
	db        *sql.DB
	stmtsOnce sync.Once
	stmtsErr  error
	stmts     struct{ claimRead, claim, heartbeat, complete, fail, release *sql.Stmt }
	// leases holds the migration lease (idem_locks); maintenance the
	// maintainer's (idem_maintenance_lock, migration 00002).
	leases, maintenance *idemmigrate.Leases
}

var _ idemdriver.Driver = (*Driver)(nil)

// prepare prepares the request-path statements once. It runs after Migrate
// (the statements name idem_keys).
func (d *Driver) prepare(ctx context.Context) error {
	d.stmtsOnce.Do(func() {
		for _, s := range []struct {
			dst   **sql.Stmt
			query string
		}{
			{&d.stmts.claimRead, claimReadSQL}, {&d.stmts.claim, claimSQL}, {&d.stmts.heartbeat, heartbeatSQL},
			{&d.stmts.complete, completeSQL}, {&d.stmts.fail, failSQL}, {&d.stmts.release, releaseSQL},
		} {
			if *s.dst, d.stmtsErr = d.db.PrepareContext(ctx, s.query); d.stmtsErr != nil {
				d.stmtsErr = fmt.Errorf("idemsqlite: prepare (has Migrate run?): %w", d.stmtsErr)
				return
			}
		}
	})
	return d.stmtsErr
}

// SingleWriter implements idemdriver.SingleWriter: SQLite has one writer.
func (d *Driver) SingleWriter() bool { return true }

// DB returns the database handle, for the application's own queries.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the database.
func (d *Driver) Close() error { return d.db.Close() }

// now is SQLite's clock in microseconds, moved by the @offset parameter.
// SQLite keeps 'now' fixed within one statement, so every use agrees.
const now = `(CAST(unixepoch('subsec') * 1000000 AS INTEGER) + @offset)`

const columns = `scope, key, method, path, fingerprint, state, fencing_token, locked_until,
	response_status, response_headers, response_body, response_body_stored, response_body_size, seal_key, seal_tag,
	created_at, updated_at, completed_at, expires_at, attempts, owner, locked_until - ` + now

// The claim: insert, or take over a record (CONTRACT section 3) that no
// live lease holds and that is either the same request unfinished (FAILED,
// or PROCESSING past its lease: it continues the record's life, keeping
// created_at and so its relayed key) or expired (another life starts:
// created_at now, attempts 1). Every claim sets expires_at to now +
// retention, so the outcome it writes can be replayed for a whole
// retention. excluded.created_at is this statement's "now". The conflict
// clause (idemsql.ClaimUpsertSQL) is idemdriver.Decide's claiming rows.
var claimSQL = `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
	locked_until, created_at, updated_at, expires_at, attempts, owner)
VALUES (@scope, @key, @method, @path, @fingerprint, 'PROCESSING', 1,
	` + now + ` + @lease, ` + now + `, ` + now + `, ` + now + ` + @retention, 1, @owner)
` + idemsql.ClaimUpsertSQL("idem_keys", "excluded.locked_until") + `
RETURNING ` + columns

var getSQL = `SELECT ` + columns + `, request FROM idem_keys WHERE scope = @scope AND key = @key`

var claimReadSQL = `SELECT ` + columns + `, expires_at <= ` + now + ` FROM idem_keys WHERE scope = @scope AND key = @key`

const fenced = ` WHERE scope = @scope AND key = @key AND fencing_token = @token AND created_at = @created
	AND state = 'PROCESSING'`

var heartbeatSQL = `UPDATE idem_keys SET locked_until = ` + now + ` + @lease, updated_at = ` + now + fenced

var completeSQL = `UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,
	response_status = @status, response_headers = @headers, response_body = @body,
	response_body_stored = @stored, response_body_size = @size, seal_key = @sealkey, seal_tag = @sealtag, request = @request,
	completed_at = ` + now + `, updated_at = ` + now + fenced

var failSQL = `UPDATE idem_keys SET state = 'FAILED', locked_until = NULL, updated_at = ` + now + fenced

var releaseSQL = `DELETE FROM idem_keys` + fenced

// Migrate applies the embedded migrations with idemmigrate (goose, SQLite
// dialect), recording them in SchemaVersionTable, under the migration lease
// in idem_locks, so processes opening one file at the same time migrate one
// after another. It is safe to call on every start.
func (d *Driver) Migrate(ctx context.Context) error {
	return d.MigrateFS(ctx, embedded(), SchemaVersionTable)
}

// MigrateFS applies a set of goose SQL migrations (the files at the root of
// fsys) to d's file, recorded in versionTable, as Migrate applies idem's:
// for an application's tables beside idem's (cmd/paymentsd and
// cmd/fakepsp). Each version runs in one transaction, DDL included, so a
// version that fails leaves nothing applied; the error is an
// *idemmigrate.Error. idempgx and idemmysql have the same method.
func (d *Driver) MigrateFS(ctx context.Context, fsys fs.FS, versionTable string) error {
	m, err := d.migrator(fsys, versionTable)
	if err != nil {
		return err
	}
	return m.Up(ctx)
}

// migrator is idemmigrate's migrator of fsys on d's file.
func (d *Driver) migrator(fsys fs.FS, versionTable string) (*idemmigrate.Migrator, error) {
	return idemmigrate.New(idemmigrate.Config{Prefix: "idemsqlite", DB: d.db, Dialect: idemmigrate.SQLite,
		FS: fsys, VersionTable: versionTable, Leases: d.leases})
}

// embedded is idem's own migrations.
func embedded() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the directory is embedded
	}
	return sub
}

// Claim implements idemdriver.Driver. It reads first: a record that cannot be
// claimed (SUCCEEDED, PROCESSING under a live lease, another request's key)
// is answered from that read, which in WAL mode never waits for the single
// writer, so a storm of duplicates does not queue behind the owner's
// business transaction. Otherwise the upsert decides, atomically; when it
// loses a race the record is read again. Statements: a replay, 409 or 422
// is one read; a claim is one read and one upsert.
func (d *Driver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	args := claimArgs(p)
	if err := d.prepare(ctx); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	for try := 0; try < maxClaimTries; try++ {
		read, answer, err := d.readClaim(ctx, p, args)
		switch {
		case err != nil:
			return idemdriver.ClaimResult{}, err
		case answer:
			return idemdriver.ClaimResult{Record: *read}, nil
		}
		var rec idemdriver.Record
		err = retryBusy(ctx, func() error {
			rec, err = scanRecord(d.stmts.claim.QueryRowContext(ctx, args...), nil)
			return err
		})
		switch {
		case err == nil:
			return claimed(read, rec), nil
		case read != nil && queued(ctx, err):
			// Another transaction holds the write lock for the whole claim:
			// the record's owner, most likely, in its business transaction
			// (a single writer's owner does not renew its lease meanwhile,
			// so the lease read may have run out). No one can take the key
			// over while that lock is held: answer from the record read
			// (the core answers 409, or replays once the owner commits),
			// not a store error.
			return idemdriver.ClaimResult{Record: *read}, nil
		case !errors.Is(err, sql.ErrNoRows):
			return idemdriver.ClaimResult{}, err
		}
		// Another claimant won between the read and the upsert: read its row.
	}
	return idemdriver.ClaimResult{}, fmt.Errorf("idemsqlite: claim gave no answer after %d tries", maxClaimTries)
}

// claimArgs are the named parameters of the claim's statements
// (claimReadSQL, claimSQL).
func claimArgs(p idemdriver.ClaimParams) []any {
	return []any{
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("method", p.Method),
		sql.Named("path", p.Path), sql.Named("fingerprint", p.Fingerprint),
		sql.Named("lease", p.LeaseDuration.Microseconds()), sql.Named("retention", p.Retention.Microseconds()),
		sql.Named("owner", p.Owner), sql.Named("offset", p.ClockOffset.Microseconds()),
	}
}

// readClaim is a claim's first read, outside any transaction (WAL readers
// never wait for the writer): the record, nil when there is none, and
// whether it cannot be claimed (idemdriver.Decide), so that it is the
// claim's answer. args are claimArgs(p).
func (d *Driver) readClaim(ctx context.Context, p idemdriver.ClaimParams, args []any) (read *idemdriver.Record, answer bool, err error) {
	var expired bool
	rec, err := scanRecord(d.stmts.claimRead.QueryRowContext(ctx, args...), &expired)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return &rec, !idemdriver.Decide(&rec, expired, p).Claims(), nil
}

// claimed is the result of an upsert that claimed rec after the claim's
// read found read (nil for none). A takeover is told from the state read
// just before the upsert: a late owner's FAILED written in between (a
// reclaim then) would still be reported as a takeover.
func claimed(read *idemdriver.Record, rec idemdriver.Record) idemdriver.ClaimResult {
	tookOver := read != nil && read.State == idemdriver.StateProcessing && rec.Attempts > 1
	return idemdriver.ClaimResult{Claimed: true, TookOver: tookOver, Record: rec}
}

// maxClaimTries bounds the read-then-upsert rounds of one Claim; each lost
// round means another request changed the record in between.
const maxClaimTries = 5

// Get implements idemdriver.Driver.
func (d *Driver) Get(ctx context.Context, p idemdriver.GetParams) (idemdriver.Record, error) {
	rec, err := scanWithRequest(d.db.QueryRowContext(ctx, getSQL,
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("offset", p.ClockOffset.Microseconds())))
	if errors.Is(err, sql.ErrNoRows) {
		return rec, idemdriver.ErrNotFound
	}
	return rec, err
}

// Heartbeat implements idemdriver.Driver. A renewal that waited for the
// write lock until ctx's deadline (another transaction holds it) returns an
// error wrapping idemdriver.ErrBusy: it was queued, not refused.
func (d *Driver) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := d.prepare(ctx); err != nil {
		return false, err
	}
	ok, err := execFenced(ctx, d.stmts.heartbeat, p, sql.Named("lease", p.LeaseDuration.Microseconds()))
	if err != nil && queued(ctx, err) {
		err = fmt.Errorf("idemsqlite: renewal queued behind another transaction: %w: %w", idemdriver.ErrBusy, err)
	}
	return ok, err
}

// Complete implements idemdriver.Driver.
func (d *Driver) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	if err := d.prepare(ctx); err != nil {
		return false, err
	}
	return complete(ctx, d.stmts.complete, p)
}

// Fail implements idemdriver.Driver.
func (d *Driver) Fail(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := d.prepare(ctx); err != nil {
		return false, err
	}
	return execFenced(ctx, d.stmts.fail, p)
}

// Release implements idemdriver.Driver: a fenced DELETE.
func (d *Driver) Release(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := d.prepare(ctx); err != nil {
		return false, err
	}
	return execFenced(ctx, d.stmts.release, p)
}

// Begin implements idemdriver.Driver with BEGIN IMMEDIATE: the transaction
// holds SQLite's write lock from its first statement, so it never fails
// half-way with SQLITE_BUSY when it starts writing.
//
// A protected handler gets this transaction with
// idem.Tx[*sql.Tx](r.Context()), beginning it on first use (BEGIN
// IMMEDIATE). Do the business writes in it and leave Commit and Rollback to
// idem: the completion is written in the same transaction and committed with
// it (CONTRACT section 6).
func (d *Driver) Begin(ctx context.Context) (idemdriver.Tx, error) {
	if err := d.prepare(ctx); err != nil {
		return nil, err
	}
	var tx *sql.Tx
	err := retryBusy(ctx, func() (err error) {
		tx, err = d.db.BeginTx(ctx, nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	stmt := d.stmts.complete
	return &idemsql.SQLTx{Tx: tx, CompleteIn: func(ctx context.Context, tx *sql.Tx, p idemdriver.CompleteParams) (bool, error) {
		return complete(ctx, tx.StmtContext(ctx, stmt), p)
	}}, nil
}

func complete(ctx context.Context, stmt *sql.Stmt, p idemdriver.CompleteParams) (bool, error) {
	headers, body, err := idemsql.EncodeResponse(p.Response)
	if err != nil {
		return false, err
	}
	return execFenced(ctx, stmt, p.FenceParams,
		sql.Named("status", p.Response.Status), sql.Named("headers", headers), sql.Named("body", body),
		sql.Named("stored", p.Response.BodyStored), sql.Named("size", p.Response.BodySize),
		sql.Named("sealkey", p.Response.SealKey), sql.Named("sealtag", p.Response.SealTag), sql.Named("request", p.Response.Request))
}

// execFenced runs a compare-and-set on the fencing token; false means the
// caller no longer owns the record.
func execFenced(ctx context.Context, stmt *sql.Stmt, p idemdriver.FenceParams, extra ...any) (bool, error) {
	args := append([]any{sql.Named("scope", p.Scope), sql.Named("key", p.Key),
		sql.Named("token", p.FencingToken), sql.Named("created", p.CreatedAt.UnixMicro()),
		sql.Named("offset", p.ClockOffset.Microseconds())}, extra...)
	var n int64
	err := retryBusy(ctx, func() error {
		res, err := stmt.ExecContext(ctx, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n == 1, err
}

// retryBusy retries f a few times when SQLite still answers SQLITE_BUSY or
// SQLITE_LOCKED after its busy timeout.
func retryBusy(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = f(); !isBusy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 10 * time.Millisecond):
		}
	}
	return err
}

// queued reports whether a write failed because it waited for the write
// lock: SQLITE_BUSY after the busy timeout, or ctx's deadline while it
// waited (a fenced write or an upsert of one row takes microseconds once it
// holds the lock).
func queued(ctx context.Context, err error) bool {
	return isBusy(err) || errors.Is(ctx.Err(), context.DeadlineExceeded)
}

func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

// scanWithRequest reads one row of columns followed by the request column
// (getSQL, listSQL), the request in the record's response.
func scanWithRequest(row interface{ Scan(...any) error }) (idemdriver.Record, error) {
	var request []byte
	rec, err := scanRecord(row, nil, &request)
	return idemsql.WithRequest(rec, request), err
}

// scanRecord reads one row of columns, followed by the expired flag when
// expired is not nil, then by extra.
func scanRecord(row interface{ Scan(...any) error }, expired *bool, extra ...any) (idemdriver.Record, error) {
	var (
		rec                                 idemdriver.Record
		state                               string
		lockedUntil, completedAt, leaseLeft sql.NullInt64
		resp                                idemsql.ResponseColumns
		createdAt, updatedAt, expiresAt     int64
	)
	dest := []any{&rec.Scope, &rec.Key, &rec.Method, &rec.Path, &rec.Fingerprint, &state, &rec.FencingToken,
		&lockedUntil, &resp.Status, &resp.Headers, &resp.Body, &resp.Stored, &resp.Size, &resp.SealKey, &resp.SealTag,
		&createdAt, &updatedAt, &completedAt, &expiresAt, &rec.Attempts, &rec.Owner, &leaseLeft}
	if expired != nil {
		dest = append(dest, expired)
	}
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return rec, err
	}
	rec.State = idemdriver.State(state)
	rec.CreatedAt, rec.UpdatedAt, rec.ExpiresAt = idemsql.MicrosTime(createdAt), idemsql.MicrosTime(updatedAt), idemsql.MicrosTime(expiresAt)
	rec.LockedUntil, rec.CompletedAt = idemsql.NullMicrosTime(lockedUntil), idemsql.NullMicrosTime(completedAt)
	rec.LeaseLeft = idemsql.LeaseLeft(rec.State, time.Duration(leaseLeft.Int64)*time.Microsecond, leaseLeft.Valid)
	rec.Response = idemsql.DecodeResponse(rec.State, resp)
	return rec, nil
}
