// Package idempgx is idem's PostgreSQL driver, on pgx v5 (pgxpool).
//
// A claim on a plain table sends two plain statements, in an order that
// follows the traffic (Options.ClaimOrder; by default the majority of the
// driver's recent claims): a SELECT of the record by primary key, which is
// the whole claim of a replay, 409 or 422 when it comes first, and an
// INSERT ... ON CONFLICT DO NOTHING of a new PROCESSING record, which is
// the whole claim of a new key when it comes first. When neither is the
// answer (a record that may be claimed, or a key written between the two)
// the claim statement decides: a read of the record and an INSERT ... ON
// CONFLICT DO UPDATE ... WHERE in a data-modifying CTE that runs only when
// the record read can be claimed, atomically. Times are PostgreSQL's:
// statement_timestamp() for the read, clock_timestamp() where a lease is
// written, so a claim that waited on a row lock never writes a lease already
// run out. pgx prepares and caches each
// statement on each connection, so the request path parses no SQL twice.
//
// # Round trips
//
// Where statements need not wait for one another they go together, in a pgx
// batch (one pipeline, one round trip): the business transaction's BEGIN
// with its first Exec; the completion with the COMMIT, written so that it
// raises when it is fenced out and the server then skips the COMMIT
// (idemdriver.CompleteCommitter); in the one-commit mode BEGIN and the
// claim's INSERT, which also sets the transaction's lock bound. In the
// order that suits each (ClaimOrder), a replay, 409 or 422 is one
// statement, and a first execution that writes in the claim's transaction
// three round trips around the handler's own statements (the claim's
// INSERT, BEGIN with the first of them, the completion with the COMMIT), in
// the one-commit mode two.
//
// # Behind pgbouncer
//
// Session pooling (pool_mode=session) needs nothing: idem takes no
// session-scoped lock (its migration, maintenance and partition locks are
// lease rows in idem_locks, see idemdriver/idemmigrate; the partitioned
// claim's lock is transaction-scoped). Transaction pooling
// (pool_mode=transaction) needs an exec mode that does not keep prepared
// statements across transactions, named in the URL:
//
//	postgres://app@pgbouncer:6432/app?default_query_exec_mode=exec
//
// exec, simple_protocol and cache_describe work; pgx's default
// cache_statement and describe_exec do not (ErrPoolerExecMode; pass
// Options.TransactionPooler to NewWithOptions to be refused at once, and
// Migrate reports the symptom under that error). pgbouncer refuses
// search_path as a startup parameter (or drops it, with
// ignore_startup_parameters): name idem's schema with Options.Schema
// instead (or set search_path on the role: ALTER ROLE ... SET search_path).
// The conformance suite runs through pgbouncer 1.18 in transaction mode with
// IDEMPGX_TEST_POOLER=transaction and TEST_DATABASE_URL pointing at it.
//
// # Lease renewals
//
// Renew (idemdriver.Renewer) extends every lease an engine holds with one
// UPDATE per tick, on a connection of the driver's own outside the pool,
// opened with the pool's configuration: a burst of claims that takes every
// pooled connection does not keep the renewals waiting until the leases
// run out. It keeps no session state (one autocommitted statement, in the
// pool's exec mode), so behind pgbouncer it is one more client connection
// per process, lending a server connection for one statement per tick.
package idempgx

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

//go:embed migrations/*.sql migrations_partitioned/*.sql
var migrations embed.FS

// SchemaVersionTable is the table in which the migration tool keeps the
// applied schema versions (in the connection's search_path schema).
const SchemaVersionTable = "idem_schema_version"

// Driver implements idemdriver.Driver on a pgx pool, on a plain idem_keys
// table (New) or one range partitioned by expires_at (NewPartitioned). It
// also implements the optional interfaces of retention and operations:
// idemdriver.Purger, MaintenanceLocker, Inspector, Migrator and Partitioner
// (see retention.go and partitioned.go), and idemdriver.Renewer, on a
// connection of its own (renew.go).
type Driver struct {
	pool *pgxpool.Pool
	// part is nil on a plain table.
	part *PartitionConfig

	sqlOnce sync.Once
	sqlDB   *sql.DB             // database/sql on pool, for goose and the leases
	leases  *idemmigrate.Leases // idem_locks: the migration, maintenance and partition locks
	// schema qualifies idem's tables in every statement (Options.Schema);
	// qualified caches the rewritten statements (see q).
	schema    string
	qualified sync.Map
	// order is the order of the claim's read and INSERT (Options.ClaimOrder).
	order claimOrder
	// consts are the boxed claim arguments of the last claim (claimArgs).
	consts atomic.Pointer[claimConsts]
	// listen is Options.ListenConfig; pooled is Options.TransactionPooler
	// (see Notifies).
	listen *pgx.ConnConfig
	pooled bool
	// renewal is Renew's connection, outside the pool.
	renewal renewConn
}

var _ idemdriver.Driver = (*Driver)(nil)

// New returns a driver on pool. The idem_keys table lives in the pool's
// search_path schema; call Migrate before use.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// Pool returns the driver's pool, for the application's own queries.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// now is the database clock moved by the @offset parameter (microseconds).
const now = `(statement_timestamp() + @offset::bigint * interval '1 microsecond')`

// curCTE is the claim statements' first step, "cur": the record read, if
// any, with whether it may be claimed at clock (CONTRACT section 3, the
// rule idemdriver.Decide states): no live lease, and expired or a retry of
// the same request that has not succeeded.
func curCTE(clock string) string {
	return `cur AS (
	SELECT ` + columns + `,
		` + claimable(clock) + ` AS claimable
	FROM idem_keys WHERE scope = @scope AND key = @key
)`
}

// claimable is the condition under which the record read may be claimed at
// clock (see curCTE). A PROCESSING record without a lease bound
// (idemdriver.DecisionDamaged) is never claimable, so "cur" answers it.
func claimable(clock string) string {
	return `NOT (state = 'PROCESSING' AND coalesce(locked_until > ` + clock + `, true))
		AND (expires_at <= ` + clock + `
			OR (method = @method AND path = @path AND fingerprint = @fingerprint AND state IN ('FAILED', 'PROCESSING')))`
}

// readSQL is the claim's read (Claim, ClaimTx): a plain SELECT of the
// record by primary key, with the database's now (for the lease left and
// whether the record expired, which Claim decides from with
// idemdriver.Decide, the rule claimSQL's "cur" states in SQL). A replay,
// 409 or 422 in the read-first order ends here (see ClaimOrder). It takes
// three parameters and computes nothing but now: PostgreSQL answers it at
// the cost of a read of the record's columns, where a read that decided in
// SQL (the claimable condition over the method, path and fingerprint sent
// as three more parameters, and the lease left as a numeric) cost a fifth
// more (docs/benchmarks.md). The scope and key are the claim's own.
var readSQL = bind(readParams, `SELECT `+now+`, `+readColumns+`
	FROM idem_keys WHERE scope = @scope AND key = @key`)

// readParams are readSQL's parameters, claimParams's first three.
var readParams = claimParams[:3]

// readColumns are the columns readSQL reads after now, scanned by
// scanRead: the record's columns but its scope and key (the claim's own)
// and its lease left (locked_until less now).
const readColumns = `method, path, fingerprint, state, fencing_token, locked_until,
	response_status, response_headers, response_body, response_body_stored, response_body_size, seal_key, seal_tag,
	created_at, updated_at, completed_at, expires_at, attempts, owner`

// insertSQL is the claim of a new key: a plain INSERT of the PROCESSING
// record (DecisionNew: fencing token 1, attempts 1, created_at now), as
// claimSQL writes a new one. ON CONFLICT DO NOTHING: an existing record (the
// INSERT first) or one written since the read (the read first) is not
// touched, no row comes back, and Claim reads or decides with claimSQL.
// With no record to meet it takes no row lock and writes nothing but the
// new row; meeting one it inserts nothing, takes no transaction id and
// writes no WAL. It returns what the database decided (created_at, which is
// also updated_at, expires_at, locked_until and the lease left); the rest
// of the record is the claim's parameters (scanInserted).
var insertSQL = bind(claimParams, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
		locked_until, created_at, updated_at, expires_at, attempts, owner)
	VALUES (@scope, @key, @method, @path, @fingerprint, 'PROCESSING', 1,
		`+now+` + @lease::bigint * interval '1 microsecond', `+now+`, `+now+`,
		`+now+` + @retention::bigint * interval '1 microsecond', 1, @owner)
	ON CONFLICT DO NOTHING
	RETURNING created_at, expires_at, locked_until, `+leaseLeft)

// insertBoundedSQL is insertSQL for the one-commit claim (ClaimTx): in the
// claim's transaction, and bounding its lock waits as claimBoundedSQL does
// (@wait: lock_timeout in milliseconds, as text), set in the WHERE of the
// row it proposes, before the INSERT can wait on the key.
var insertBoundedSQL = bind(slices.Concat(claimParams, []string{"wait"}), `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
		locked_until, created_at, updated_at, expires_at, attempts, owner)
	SELECT @scope::text, @key::text, @method::text, @path::text, @fingerprint::bytea, 'PROCESSING', 1,
		`+now+` + @lease::bigint * interval '1 microsecond', `+now+`, `+now+`,
		`+now+` + @retention::bigint * interval '1 microsecond', 1, @owner::text
	WHERE set_config('lock_timeout', @wait, true) IS NOT NULL
	ON CONFLICT DO NOTHING
	RETURNING created_at, expires_at, locked_until, `+leaseLeft)

// insertNew runs insertSQL for p (args its claimArgs): the new record, or
// inserted false when the key was written since the read.
func (d *Driver) insertNew(ctx context.Context, p idemdriver.ClaimParams, args []any) (idemdriver.ClaimResult, bool, error) {
	return scanInserted(d.pool.QueryRow(ctx, d.q(insertSQL), args...), p)
}

// scanInserted reads the row insertSQL or insertBoundedSQL returns for p:
// the new record, or inserted false when the statement inserted nothing.
func scanInserted(row pgx.Row, p idemdriver.ClaimParams) (res idemdriver.ClaimResult, inserted bool, err error) {
	type targets struct {
		created, expires, lockedUntil pgtype.Timestamptz
		leaseLeft                     pgtype.Int8
	}
	v := new(targets)
	err = row.Scan(&v.created, &v.expires, &v.lockedUntil, &v.leaseLeft)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	res.Claimed, res.Record = true, idemdriver.Record{
		Scope: p.Scope, Key: p.Key, Method: p.Method, Path: p.Path, Fingerprint: p.Fingerprint,
		State: idemdriver.StateProcessing, FencingToken: 1, Owner: p.Owner, Attempts: 1,
		LeaseLeft:   idemsql.LeaseLeft(idemdriver.StateProcessing, time.Duration(v.leaseLeft.Int64)*time.Microsecond, v.leaseLeft.Valid),
		CreatedAt:   v.created.Time,
		UpdatedAt:   v.created.Time,
		ExpiresAt:   v.expires.Time,
		LockedUntil: timePtr(v.lockedUntil),
	}
	return res, true, nil
}

// clock is the database clock when the expression is evaluated, moved by
// @offset: unlike now, fixed when the statement starts, it has moved on by
// the time a statement that waited for a row lock writes. A lease counts
// from when the claim's (or heartbeat's) write takes effect, so it is never
// born expired, and the lease left is measured with it.
const clock = `(clock_timestamp() + @offset::bigint * interval '1 microsecond')`

const columns = `scope, key, method, path, fingerprint, state, fencing_token, locked_until,
	response_status, response_headers, response_body, response_body_stored, response_body_size, seal_key, seal_tag,
	created_at, updated_at, completed_at, expires_at, attempts, owner,
	` + leaseLeft

// leaseLeft is the lease left of the record, in microseconds (NULL when it
// holds none).
const leaseLeft = `(extract(epoch FROM locked_until - ` + clock + `) * 1000000)::bigint`

// The claim statement, which decides when readSQL finds a record that may
// be claimed, or the record changed between readSQL and insertSQL (written
// since the read, or removed since the INSERT met it). "cur" reads the
// record from the statement's snapshot, and whether this request may claim it. When it exists and cannot
// be claimed (SUCCEEDED, PROCESSING under a live lease, another request's
// key), the INSERT inserts nothing and that row is the answer: a replay, 409
// or 422 is a plain read, with no row lock, no transaction id and no WAL
// flush. Otherwise the INSERT ... ON CONFLICT DO UPDATE ... WHERE decides
// atomically against the latest committed version: a new record, or a
// takeover of one that no live lease holds and that is either the same
// request unfinished (FAILED, or PROCESSING past its lease: the record's life
// continues, created_at and so the relayed key kept) or expired (a new life).
// Every claim sets expires_at to now + retention (idemdriver.Decide states
// the rule; this statement is its SQL).
//
// When that INSERT loses a race, the winner's row is one the statement's
// snapshot cannot see: ON CONFLICT checks the latest version, but "cur"
// still shows the row as it was, claimable. That stale row must not be the
// answer (it would give 422 with the expired record's old payload, or 409
// on a lease that has run out), so no row comes back, and Claim runs the
// statement again with a new snapshot, which sees the winner.
var claimSQL = bind(claimParams, claimStatement(""))

// claimBoundedSQL is claimSQL that also bounds the transaction's lock waits
// (@wait: lock_timeout in milliseconds, as text, local to the transaction),
// for the one-commit claim (ClaimTx): one statement instead of a set_config
// of its own before the claim. The bound is in the WHERE of the row the
// INSERT proposes, so it is set before the INSERT can wait on the key: for
// a concurrent claim's uncommitted row (the unique index) or for a takeover's
// row lock (ON CONFLICT DO UPDATE). A claim that inserts nothing because
// "cur" is the answer may not set it; that transaction is rolled back.
var claimBoundedSQL = bind(slices.Concat(claimParams, []string{"wait"}),
	claimStatement(` AND set_config('lock_timeout', @wait, true) IS NOT NULL`))

// claimStatement is the claim's text (see claimSQL) with extra, an SQL
// condition starting with AND, added to the WHERE of the row its INSERT
// proposes.
func claimStatement(extra string) string {
	return `WITH ` + curCTE(now) + `, claim AS (
	INSERT INTO idem_keys AS k (scope, key, method, path, fingerprint, state, fencing_token,
		locked_until, created_at, updated_at, expires_at, attempts, owner)
	SELECT @scope::text, @key::text, @method::text, @path::text, @fingerprint::bytea, 'PROCESSING', 1,
		` + now + ` + @lease::bigint * interval '1 microsecond', ` + now + `, ` + now + `,
		` + now + ` + @retention::bigint * interval '1 microsecond', 1, @owner::text
	WHERE NOT EXISTS (SELECT 1 FROM cur WHERE NOT claimable)` + extra + `
	` + idemsql.ClaimUpsertSQL("k", clock+` + @lease::bigint * interval '1 microsecond'`) + `
	RETURNING ` + columns + `
)
SELECT true, *, coalesce((SELECT state = 'PROCESSING' FROM cur), false) AND attempts > 1 FROM claim
UNION ALL
SELECT false, ` + columns + `, false FROM cur WHERE NOT claimable AND NOT EXISTS (SELECT 1 FROM claim)`
}

var getSQL = bind([]string{"scope", "key", "offset"}, `SELECT `+columns+`, request FROM idem_keys WHERE scope = @scope AND key = @key`)

// fenced is the compare-and-set of every write after the claim: this
// execution's record (scope, key, fencing token, created_at), PROCESSING.
const fenced = ` WHERE scope = @scope AND key = @key AND fencing_token = @token AND created_at = @created
	AND ` + stillProcessing

// stillProcessing is state = 'PROCESSING' in a form that PostgreSQL cannot
// match to the predicate of the partial index idem_keys_processing (WHERE
// state = 'PROCESSING'): an expression of the column is never matched. With
// statistics that know of few PROCESSING records, the planner otherwise
// scans that index and filters every record in flight (5,000 rows for one
// completion with 5,000 in flight) instead of looking the row up by its
// primary key (TestFencedWritesUsePrimaryKey).
const stillProcessing = `(state || '') = 'PROCESSING'`

// fenceParams are the parameters of fenced, first in every fenced write's
// arguments (fenceArgs); the writes' own follow.
var fenceParams = []string{"scope", "key", "token", "created"}

var heartbeatSQL = bind(append(fenceParams, "offset", "lease"),
	`UPDATE idem_keys SET locked_until = `+clock+` + @lease::bigint * interval '1 microsecond',
	updated_at = `+now+fenced)

// completeParams are the parameters of completeSQL and completeOrRaiseSQL,
// in completeArgs's order.
var completeParams = append(fenceParams, "offset", "status", "headers", "body", "stored", "size", "sealkey", "sealtag", "request")

const completeUpdate = `UPDATE idem_keys SET state = 'SUCCEEDED', locked_until = NULL,
	response_status = @status, response_headers = @headers, response_body = @body,
	response_body_stored = @stored, response_body_size = @size, seal_key = @sealkey, seal_tag = @sealtag, request = @request,
	completed_at = ` + now + `, updated_at = ` + now + fenced

var completeSQL = bind(completeParams, completeUpdate)

// completeOrRaiseSQL is the completion sent in one pipeline with the COMMIT
// (businessTx.CompleteCommit): it raises an error when it updates no row
// (fenced out), so that the server skips the COMMIT after it and the
// business writes stay uncommitted. The error's condition depends on the
// row count, so the planner cannot fold it into a constant and raise it
// always; its message holds fencedOutMarker.
var completeOrRaiseSQL = bind(completeParams, completeOrRaise(` RETURNING 1`))

// completeOrRaise is completeOrRaiseSQL's text with the completion's
// RETURNING clause.
func completeOrRaise(returning string) string {
	return `WITH done AS (` + completeUpdate + returning + `)
SELECT CASE count(*) WHEN 1 THEN true ELSE ('` + fencedOutMarker + ` ' || count(*))::boolean END FROM done`
}

// fencedOutMarker is in the message of the error completeOrRaiseSQL raises
// (22P02 invalid_text_representation) when the completion is fenced out.
const fencedOutMarker = "idempgx: completion fenced out, rows updated:"

const failUpdate = `UPDATE idem_keys SET state = 'FAILED', locked_until = NULL, updated_at = ` + now + fenced

var failSQL = bind(failParams, failUpdate)

const releaseDelete = `DELETE FROM idem_keys` + fenced

var releaseSQL = bind(fenceParams, releaseDelete)

// withStepsGone is del, a DELETE of idem_keys rows (unaliased, without
// RETURNING), that deletes the steps of the record lives it deletes in the
// same statement: on the partitioned table no foreign key does
// (migrations_partitioned/00006). extra is appended to its RETURNING list
// (a notification). The statement returns one row per record deleted, so
// its command tag counts them as the DELETE's would.
func withStepsGone(del, extra string) string {
	return `WITH gone AS (` + del + ` RETURNING idem_keys.scope, idem_keys.key, idem_keys.created_at` + extra + `)` + stepsGone
}

// stepsGone ends a statement whose CTE "gone" returns the (scope, key,
// created_at) of deleted records: it deletes their steps and returns one row
// per record.
const stepsGone = `, steps_gone AS (
	DELETE FROM idem_steps s USING gone g WHERE s.scope = g.scope AND s.key = g.key AND s.created_at = g.created_at
)
SELECT 1 FROM gone`

// claimParams are the parameters of the claim statements (claimSQL,
// claimPartitionedSQL), in claimArgs's order.
// The first three are readSQL's.
var claimParams = []string{"scope", "key", "offset", "method", "path", "fingerprint", "lease", "retention", "owner"}

// claimArgs are the arguments of the claim statements for p, in
// claimParams's order, with room for one more (claimBoundedSQL's wait).
func (d *Driver) claimArgs(p idemdriver.ClaimParams) []any {
	args := readArgs(p)
	d.fullArgs(&args, p)
	return args
}

// readArgs are readSQL's arguments for p (readParams), in a slice with
// room for claimArgs's: a replay, 409 or 422 read first boxes nothing more.
func readArgs(p idemdriver.ClaimParams) []any {
	args := make([]any, 0, len(claimParams)+1)
	return append(args, p.Scope, p.Key, p.ClockOffset.Microseconds())
}

// fullArgs completes *args, readArgs's for p, to claimArgs's; complete
// already, it is left as it is. Each string, []byte or int64 above 255 put
// in an any is an allocation of its own; the lease, the retention and the
// owner are the same on every claim of a Middleware, so they are boxed
// once (claimConsts), and the common methods are boxed constants.
func (d *Driver) fullArgs(args *[]any, p idemdriver.ClaimParams) {
	if len(*args) > len(readParams) {
		return
	}
	lease, retention := p.LeaseDuration.Microseconds(), p.Retention.Microseconds()
	c := d.consts.Load()
	if c == nil || c.lease != lease || c.retention != retention || c.owner != p.Owner {
		c = &claimConsts{lease: lease, retention: retention, owner: p.Owner,
			leaseArg: lease, retentionArg: retention, ownerArg: p.Owner}
		d.consts.Store(c)
	}
	*args = append(*args, methodArg(p.Method), p.Path, p.Fingerprint, c.leaseArg, c.retentionArg, c.ownerArg)
}

// claimConsts are the claim arguments that come from a Middleware's Config
// (LeaseDuration, Retention, Owner), with their values boxed in an any.
// Driver.consts holds the last seen; a claim with other values replaces it.
type claimConsts struct {
	lease, retention       int64
	owner                  string
	leaseArg, retentionArg any
	ownerArg               any
}

// methodArg is method as a claim argument: the methods idem protects by
// default, and PUT and DELETE, are constants already boxed.
func methodArg(method string) any {
	switch method {
	case http.MethodPost:
		return argPOST
	case http.MethodPatch:
		return argPATCH
	case http.MethodPut:
		return argPUT
	case http.MethodDelete:
		return argDELETE
	}
	return method
}

var argPOST, argPATCH, argPUT, argDELETE any = http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodDelete

// bind turns the named parameters of query (@name) into positional ones:
// $1 for names[0], $2 for names[1], and so on. It runs once per statement,
// when the package is initialized: pgx.NamedArgs would lex the whole
// statement again on every call. A name that query does not use,
// or a parameter that names does not list, is a programming error: bind
// panics.
func bind(names []string, query string) string {
	pos := make(map[string]int, len(names))
	for i, n := range names {
		pos[n] = i + 1
	}
	used := make(map[string]bool, len(names))
	out := namedParam.ReplaceAllStringFunc(query, func(m string) string {
		i, ok := pos[m[1:]]
		if !ok {
			panic("idempgx: statement parameter " + m + " is not bound")
		}
		used[m[1:]] = true
		return "$" + strconv.Itoa(i)
	})
	if len(used) != len(names) {
		panic(fmt.Sprintf("idempgx: bound parameters %v, the statement uses %v", names, used))
	}
	return out
}

var namedParam = regexp.MustCompile(`@[a-z]+`)

// maxClaimTries bounds the re-runs of the claim statement after a lost race
// it could not read (see claimSQL) or a serialization failure.
const maxClaimTries = 5

// Migrate applies the embedded migrations with idemmigrate (goose,
// PostgreSQL dialect), under the migration lease in idem_locks, so processes
// starting together migrate once, one after another. The lease is a row,
// not a session advisory lock, so it holds behind pgbouncer's transaction
// pooling (each migration is one transaction, its DDL included). It is safe
// to call on every start. A partitioned driver (NewPartitioned) applies its
// own migrations, recorded in PartitionedSchemaVersionTable, and then
// creates the partitions of today through today + DaysAhead
// (EnsurePartitions).
//
// Behind a transaction pooler the pool must not use pgx's default
// statement cache (default_query_exec_mode=cache_statement) nor
// describe_exec: Migrate then fails with ErrPoolerExecMode, which names the
// knob (see CheckPooler).
func (d *Driver) Migrate(ctx context.Context) error {
	dir, table := d.migrationSet()
	return d.MigrateFS(ctx, dir, table)
}

// MigrateFS applies another set of goose SQL migrations (the files at the
// root of fsys) as Migrate applies idem's: recorded in versionTable, under
// the lease "migrate <versionTable>", a failure reported as an
// *idemmigrate.Error (the failed version rolled back whole). For an
// application's own tables beside idem's (cmd/paymentsd, cmd/fakepsp).
// idemmysql and idemsqlite have the same method.
func (d *Driver) MigrateFS(ctx context.Context, fsys fs.FS, versionTable string) error {
	m, err := d.migrator(ctx, fsys, versionTable)
	if err == nil {
		err = m.Up(ctx)
	}
	if err != nil {
		return poolerErr(err)
	}
	if d.part != nil && versionTable == PartitionedSchemaVersionTable {
		if _, err := d.EnsurePartitions(ctx, idemdriver.PartitionParams{}); err != nil {
			return fmt.Errorf("idempgx: migrate: %w", poolerErr(err))
		}
	}
	return nil
}

// migrationSet is the driver's embedded migrations (plain or partitioned)
// and their version table.
func (d *Driver) migrationSet() (fs.FS, string) {
	dir, table := "migrations", SchemaVersionTable
	if d.part != nil {
		dir, table = "migrations_partitioned", PartitionedSchemaVersionTable
	}
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		panic(err) // the directories are embedded
	}
	return sub, table
}

// db returns the database/sql handle on the pool and the lease table.
func (d *Driver) db() (*sql.DB, *idemmigrate.Leases) {
	d.sqlOnce.Do(func() {
		d.sqlDB = stdlib.OpenDBFromPool(d.pool)
		d.leases = idemmigrate.NewLeases(d.sqlDB, idemmigrate.Postgres, d.table(idemmigrate.DefaultLeaseTable))
	})
	return d.sqlDB, d.leases
}

// migrator returns idemmigrate's migrator of fsys, recorded in
// versionTable in the search_path schema.
//
// With Options.Schema, the version table and idem's tables in fsys are
// qualified by the schema, which must exist.
func (d *Driver) migrator(ctx context.Context, fsys fs.FS, versionTable string) (*idemmigrate.Migrator, error) {
	var schema *string
	query, args := "SELECT current_schema()", []any{}
	if d.schema != "" {
		query, args = "SELECT nspname::text FROM pg_namespace WHERE nspname = $1", []any{d.schema}
	}
	err := d.pool.QueryRow(ctx, query, args...).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && schema == nil) {
		if d.schema != "" {
			return nil, fmt.Errorf("idempgx: migrate: schema %s (Options.Schema) does not exist; create it first (CREATE SCHEMA %s)", d.schema, d.schema)
		}
		return nil, errors.New("idempgx: migrate: no schema of the connection's search_path exists; create it first (CREATE SCHEMA ...) or fix search_path")
	}
	if err != nil {
		return nil, fmt.Errorf("idempgx: migrate: %w", poolerErr(err))
	}
	if fsys, err = d.qualifiedFS(fsys); err != nil {
		return nil, fmt.Errorf("idempgx: migrations: %w", err)
	}
	db, leases := d.db()
	return idemmigrate.New(idemmigrate.Config{Prefix: "idempgx", DB: db, Dialect: idemmigrate.Postgres,
		FS: fsys, VersionTable: d.table(versionTable), Leases: leases})
}

// Claim implements idemdriver.Driver: readSQL and insertSQL, in the order
// the driver's ClaimOrder gives, then, when neither is the answer, claimSQL
// (see each).
func (d *Driver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := claimTextable(p); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	if d.part != nil {
		res, err := d.claimPartitioned(ctx, d.claimArgs(p))
		return res, unstorable(err)
	}
	args := readArgs(p)
	// The record read and a new key inserted, in either order: a record
	// that may not be claimed is the answer (a replay, 409 or 422), a new
	// key is claimed by the INSERT. Anything else, a record that may be
	// claimed or one written between the two statements, goes to the
	// claim statement.
	res, decided, err := d.readOrInsert(ctx, p, &args)
	switch {
	case err != nil && !retryable(err):
		return res, unstorable(err)
	case err == nil && decided:
		return res, nil
	}
	// A record that may be claimed (a re-claim, a takeover, an expired
	// record), or a race lost since the read: the claim statement decides
	// atomically.
	d.fullArgs(&args, p)
	var lastErr error
	for try := 0; try < maxClaimTries; try++ {
		var res idemdriver.ClaimResult
		rows, err := d.pool.Query(ctx, d.q(claimSQL), args...)
		if err != nil {
			if retryable(err) {
				lastErr = err
				continue
			}
			return res, unstorable(err)
		}
		found := false
		for rows.Next() {
			// The last column: the claim took over a PROCESSING record
			// past its lease (the state "cur" read, and a continued life).
			res.Record, err = scanRecord(rows, &res.Claimed, &res.TookOver)
			found = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		switch {
		case err != nil && retryable(err):
			lastErr = err
		case err != nil:
			return res, unstorable(err)
		case found:
			return res, nil
		default:
			lastErr = errors.New("idempgx: claim lost a race to a row it could not read")
		}
	}
	return idemdriver.ClaimResult{}, fmt.Errorf("idempgx: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

// readOrInsert runs the claim's first statements for p (*args its
// readArgs, completed by fullArgs before the INSERT), in the order d.order gives (see ClaimOrder): readSQL then,
// when it found no record, insertSQL; or insertSQL then, when the key
// exists, readSQL. decided is true when res is the claim's result: a new
// record (Claimed), or one that may not be claimed (the answer). Otherwise
// (a record that may be claimed, or one written or removed between the two
// statements) the claim statement decides.
func (d *Driver) readOrInsert(ctx context.Context, p idemdriver.ClaimParams, args *[]any) (res idemdriver.ClaimResult, decided bool, err error) {
	readFirst := d.order.readFirst()
	if readFirst {
		res, claimable, found, err := d.claimRead(ctx, p, *args)
		switch {
		case err != nil:
			return res, false, err
		case found:
			d.order.met(true)
			return res, !claimable, nil
		}
	}
	d.fullArgs(args, p)
	res, inserted, err := d.insertNew(ctx, p, *args)
	if err == nil {
		d.order.met(!inserted)
	}
	if err != nil || inserted || readFirst {
		// Read first, then the INSERT: a key it met was written since the
		// read, and the claim statement decides.
		return res, inserted, err
	}
	res, claimable, found, err := d.claimRead(ctx, p, *args)
	return res, found && !claimable, err
}

// claimRead runs readSQL for p (args its readArgs, or claimArgs) and scans the row it
// returns, if any (found is false when there is none), and whether p may
// claim it (idemdriver.Decide).
func (d *Driver) claimRead(ctx context.Context, p idemdriver.ClaimParams, args []any) (res idemdriver.ClaimResult, claimable, found bool, err error) {
	rows, err := d.pool.Query(ctx, d.q(readSQL), args[:len(readParams)]...)
	if err != nil {
		return res, false, false, err
	}
	var expired bool
	for rows.Next() {
		res.Record, expired, err = scanRead(rows, p)
		found = true
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil || !found {
		return res, false, found, err
	}
	return res, idemdriver.Decide(&res.Record, expired, p).Claims(), true, nil
}

// retryable reports errors on which the statement is simply run again:
// serialization failure and deadlock.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// unstorable wraps idemdriver.ErrUnstorable around the errors of a value
// PostgreSQL cannot hold in a text column: 22021 character_not_in_repertoire
// (invalid UTF-8, or a NUL byte: "invalid byte sequence for encoding UTF8:
// 0x00") and 22P05 untranslatable_character.
func unstorable(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "22021" || pgErr.Code == "22P05") {
		return fmt.Errorf("idempgx: %w: %w", idemdriver.ErrUnstorable, err)
	}
	return err
}

// textable returns an error wrapping idemdriver.ErrUnstorable when one of
// the values of pairs (name, value, name, value, ...) is not text that
// PostgreSQL can hold: a NUL byte (no text value holds one) or invalid UTF-8
// (pgx sets client_encoding to UTF8, so the server refuses it whatever its
// own encoding). The request-path methods check their text arguments with
// it before any statement is sent, so the answer does not depend on the
// pool's exec mode: with the extended protocol the server refuses such a
// parameter (22021, see unstorable), but simple_protocol interpolates it into
// the query text, and a NUL there breaks the message itself (08P01 "invalid
// message format"), an error that says nothing about the value.
func textable(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		v := pairs[i+1]
		switch {
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("idempgx: %w: the %s holds a NUL byte, which PostgreSQL text cannot", idemdriver.ErrUnstorable, pairs[i])
		case !utf8.ValidString(v):
			return fmt.Errorf("idempgx: %w: the %s is not valid UTF-8", idemdriver.ErrUnstorable, pairs[i])
		}
	}
	return nil
}

// claimTextable is textable for the text of a claim (Claim, ClaimTx).
func claimTextable(p idemdriver.ClaimParams) error {
	return textable("scope", p.Scope, "key", p.Key, "method", p.Method, "path", p.Path, "owner", p.Owner)
}

// fenceTextable is textable for the text of a fenced write.
func fenceTextable(p idemdriver.FenceParams) error { return textable("scope", p.Scope, "key", p.Key) }

// Get implements idemdriver.Driver.
func (d *Driver) Get(ctx context.Context, p idemdriver.GetParams) (idemdriver.Record, error) {
	if err := textable("scope", p.Scope, "key", p.Key); err != nil {
		return idemdriver.Record{}, err
	}
	rows, err := d.pool.Query(ctx, d.q(getSQL), p.Scope, p.Key, p.ClockOffset.Microseconds())
	if err != nil {
		return idemdriver.Record{}, unstorable(err)
	}
	rec, err := pgx.CollectExactlyOneRow(rows, scanWithRequest)
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, idemdriver.ErrNotFound
	}
	return rec, unstorable(err)
}

// Heartbeat implements idemdriver.Driver.
func (d *Driver) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := fenceTextable(p); err != nil {
		return false, err
	}
	return execFenced(ctx, d.pool, d.q(heartbeatSQL), fenceArgs(p, p.ClockOffset.Microseconds(), p.LeaseDuration.Microseconds()))
}

// Complete implements idemdriver.Driver.
func (d *Driver) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	return d.complete(ctx, d.pool, p)
}

// Fail implements idemdriver.Driver.
func (d *Driver) Fail(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := fenceTextable(p); err != nil {
		return false, err
	}
	q, args := notifying(p, failStatements, fenceArgs(p, p.ClockOffset.Microseconds()))
	return execFenced(ctx, d.pool, d.q(q), args)
}

// Release implements idemdriver.Driver: a fenced DELETE.
func (d *Driver) Release(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := fenceTextable(p); err != nil {
		return false, err
	}
	statements := releaseStatements
	if d.part != nil {
		statements = releasePartStatements
	}
	q, args := notifying(p, statements, fenceArgs(p))
	return execFenced(ctx, d.pool, d.q(q), args)
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// fenceArgs are the arguments of a fenced write: fenceParams's, then extra.
func fenceArgs(p idemdriver.FenceParams, extra ...any) []any {
	args := make([]any, 0, len(fenceParams)+len(extra))
	return append(append(args, p.Scope, p.Key, p.FencingToken, p.CreatedAt), extra...)
}

func (d *Driver) complete(ctx context.Context, db execer, p idemdriver.CompleteParams) (bool, error) {
	args, err := completeArgs(p)
	if err != nil {
		return false, err
	}
	q, args := notifying(p.FenceParams, completeStatements, args)
	return execFenced(ctx, db, d.q(q), args)
}

// completeArgs are the arguments of completeSQL (and completeOrRaiseSQL)
// for p, or the error of a value that cannot be stored.
func completeArgs(p idemdriver.CompleteParams) ([]any, error) {
	if err := fenceTextable(p.FenceParams); err != nil {
		return nil, err
	}
	headers, body, err := idemsql.EncodeResponse(p.Response)
	if err != nil {
		return nil, err
	}
	return fenceArgs(p.FenceParams, p.ClockOffset.Microseconds(),
		p.Response.Status, headers, body, p.Response.BodyStored, p.Response.BodySize, p.Response.SealKey, p.Response.SealTag, p.Response.Request), nil
}

// execFenced runs a compare-and-set on the fencing token; false means the
// caller no longer owns the record.
//
// On a partitioned table, a claim that re-claims an expired record moves its
// row to another partition; a fenced write that waited on that row then fails
// with a serialization failure (40001, "tuple to be updated was already moved
// to another partition"). Outside a transaction the write is run again, and
// finds the new owner's token: false. Inside the business transaction the
// error is returned (the transaction is aborted) and the core rolls back.
func execFenced(ctx context.Context, db execer, query string, args []any) (bool, error) {
	_, inTx := db.(pgx.Tx)
	for try := 0; ; try++ {
		tag, err := db.Exec(ctx, query, args...)
		if err != nil {
			if !inTx && try < 2 && retryable(err) {
				continue
			}
			return false, unstorable(err)
		}
		return tag.RowsAffected() == 1, nil
	}
}

// scanRecord reads one row of columns, preceded by the claimed flag when
// claimed is not nil and followed by extra.
func scanRecord(row pgx.Row, claimed *bool, extra ...any) (idemdriver.Record, error) {
	rec, _, err := scanColumns(row, nil, claimed, extra...)
	return rec, err
}

// scanRead reads the row readSQL returns for p: the record (its scope and
// key p's), and whether it expired at the database's now.
func scanRead(row pgx.Row, p idemdriver.ClaimParams) (idemdriver.Record, bool, error) {
	rec, now, err := scanColumns(row, &p, nil)
	rec.Scope, rec.Key = p.Scope, p.Key
	return rec, !rec.ExpiresAt.After(now), err
}

// scanColumns reads one row of columns (read nil, as scanRecord) or of
// readSQL's for the claim read (now, then readColumns; the lease left
// measured against now, which it returns; text equal to the claim's path
// or owner shares its string).
func scanColumns(row pgx.Row, read *idemdriver.ClaimParams, claimed *bool, extra ...any) (idemdriver.Record, time.Time, error) {
	v := scanTargetsPool.Get().(*scanTargets)
	defer func() {
		*v = scanTargets{} // nothing of the row outlives the scan
		scanTargetsPool.Put(v)
	}()
	rec, resp := &v.rec, &v.resp
	dest := v.dest[:0]
	switch {
	case read != nil:
		dest = append(dest, &v.now)
		v.known = [2]string{read.Path, read.Owner}
		v.scanner.known = v.known[:]
	case claimed != nil:
		dest = append(dest, claimed, &rec.Scope, &rec.Key)
	default:
		dest = append(dest, &rec.Scope, &rec.Key)
	}
	dest = append(dest, &rec.Method, &rec.Path, &rec.Fingerprint, &v.state, &rec.FencingToken,
		&v.lockedUntil, &v.status, &resp.Headers, &resp.Body, &v.stored, &v.size, &resp.SealKey, &resp.SealTag,
		&rec.CreatedAt, &rec.UpdatedAt, &v.completed, &rec.ExpiresAt, &rec.Attempts, &rec.Owner)
	if read == nil {
		dest = append(dest, &v.leaseLeft)
	}
	dest = append(dest, extra...)
	v.scanner.dest = dest
	if err := row.Scan(&v.scanner); err != nil {
		return *rec, v.now, err
	}
	rec.State = idemdriver.State(v.state)
	rec.LockedUntil, rec.CompletedAt = timePtr(v.lockedUntil), timePtr(v.completed)
	resp.Status = sql.NullInt64{Int64: v.status.Int64, Valid: v.status.Valid}
	resp.Size = sql.NullInt64{Int64: v.size.Int64, Valid: v.size.Valid}
	resp.Stored = sql.NullBool{Bool: v.stored.Bool, Valid: v.stored.Valid}
	if read != nil {
		rec.LeaseLeft = idemsql.LeaseLeft(rec.State, v.lockedUntil.Time.Sub(v.now), v.lockedUntil.Valid)
	} else {
		rec.LeaseLeft = idemsql.LeaseLeft(rec.State, time.Duration(v.leaseLeft.Int64)*time.Microsecond, v.leaseLeft.Valid)
	}
	rec.Response = idemsql.DecodeResponse(rec.State, *resp)
	return *rec, v.now, nil
}

// scanTargets are scanColumns's scan targets, in one value taken from
// scanTargetsPool: each would otherwise escape to the heap on its own, and
// a replay's would be a kilobyte of garbage. pgtype's value types scan
// without reflection (a pointer to a pointer, or a sql.Null*, costs pgx an
// allocation or two per column). What the record keeps (strings, bytes,
// the response) is allocated apart, never in them.
type scanTargets struct {
	rec                     idemdriver.Record
	state                   string
	status, size, leaseLeft pgtype.Int8
	stored                  pgtype.Bool
	lockedUntil, completed  pgtype.Timestamptz
	now                     time.Time
	resp                    idemsql.ResponseColumns
	dest                    [25]any
	scanner                 rowScanner
	known                   [2]string
}

var scanTargetsPool = sync.Pool{New: func() any { return new(scanTargets) }}

// scanWithRequest reads one row of columns followed by the request column
// (getSQL, listSQL), the request in the record's response.
func scanWithRequest(row pgx.CollectableRow) (idemdriver.Record, error) {
	var request []byte
	rec, err := scanRecord(row, nil, &request)
	return idemsql.WithRequest(rec, request), err
}

// timePtr is t's time, or nil when t is NULL.
func timePtr(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}
