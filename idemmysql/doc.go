// Package idemmysql is idem's MySQL and MariaDB driver, on database/sql with
// github.com/go-sql-driver/mysql. It supports MySQL 8.0+ and MariaDB 10.6+;
// see "Tested on" below for what has actually run against a server.
//
// # Opening
//
// Open takes a URL of the form
//
//	mysql://user:password@host:port/dbname?param=value&...
//
// (ParseURL describes every part). New wraps a *sql.DB the application
// already has; the driver does not depend on that pool's DSN settings (see
// New). Call Migrate before use, on every start if you like: it is
// idempotent and serialized across processes.
//
// # The claim
//
// MySQL has neither RETURNING nor a data-modifying CTE, so the claim of
// CONTRACT section 3 cannot be one statement that both decides and reports.
// This driver claims with an optimistic read followed by one atomic,
// conditional write, each its own autocommit statement:
//
//  1. read: one SELECT returns the record (if any) together with the
//     database's now (UTC_TIMESTAMP(6) + ClockOffset). From that row and that
//     now, Go decides whether the record can be claimed: no record, expired,
//     FAILED, or PROCESSING past its lease, with the same method, path and
//     fingerprint for the last two. If it cannot (a replay, a live lease,
//     another request), that row is the answer and the claim is over.
//  2. write, when it can: an INSERT for a new key (the primary key lets
//     exactly one concurrent INSERT through; the others fail with 1062), or,
//     for an existing row, an UPDATE ... WHERE fencing_token = <the token
//     read> AND <the claimable condition, against the same now>. Every claim
//     increments the token, so the UPDATE is a compare-and-set on the row's
//     version: InnoDB re-evaluates the WHERE clause on the latest committed
//     row under its exclusive lock, and exactly one of any number of
//     concurrent claimants matches. A heartbeat, completion or failure that
//     slipped in between is caught by the same WHERE clause.
//  3. lost race (1062, or the UPDATE matched no row): read again and answer
//     from the row that won. Deadlock (1213), MariaDB's "record has changed
//     since last read" (1020) and lock wait timeout (1205) are also answered
//     this way, never returned as errors; classify is the one place that maps
//     MySQL error numbers to these kinds. After a lock wait timeout the row is
//     held by a transaction still in progress (typically a business
//     transaction committing its completion), so when the fresh read still
//     looks claimable the claim answers "not claimed" from it: the core then
//     answers 409 request-in-flight.
//
// Because every statement is its own transaction, there is no snapshot to go
// stale: the re-read after a lost INSERT starts a new read view, which holds
// the winner's committed row whatever the session's isolation level. (Under
// REPEATABLE READ, the server default, a SELECT inside a transaction that had
// already read would miss it; TestRepeatableReadPool pins this.) Nothing
// holds a row lock across round trips either, so claims deadlock only in
// InnoDB's insert-queue case: when an INSERT of the key rolls back while
// several others wait on it, the waiters deadlock and InnoDB picks victims
// (TestDeadlockRace); the victims read again and answer from the winner's row.
// The values of a won claim (token, times, attempts) follow from the row read
// and the now read, which the compare-and-set pins, so no read-back is needed.
//
// # Statements per outcome (CONTRACT section 10)
//
//   - replay (SUCCEEDED), 409 (live lease), 422 (another request): 1 SELECT.
//   - first execution of a new key: 2 (SELECT + INSERT), then 1 UPDATE for
//     the completion (or the completion rides in the business transaction).
//   - takeover of an expired lease, re-claim after FAILED, reuse of an expired
//     key: 2 (SELECT + UPDATE).
//   - a claimant that loses a race: one more SELECT after its failed write.
//   - heartbeat, completion, failure: 1 UPDATE each.
//   - the renewal of every lease an engine holds (idemdriver.Renewer): 1
//     UPDATE per tick for up to 1,000 leases, plus 1 SELECT when it did not
//     renew them all; on a connection of its own beside Open's pool.
//   - writes in the claim's transaction: the claim (2), then START
//     TRANSACTION, the business writes, the completion UPDATE and COMMIT:
//     5 statements besides the business writes on Open's pool, whose
//     sessions default to READ COMMITTED; 6 on a pool from New, where
//     go-sql-driver sends SET TRANSACTION ISOLATION LEVEL READ COMMITTED
//     before START TRANSACTION.
//
// The suite's statement budget test holds the driver to these figures (3 for
// a first execution, 5 with writes in the claim's transaction, 1 for a
// replay, a 409 or a 422). The first execution costs one statement more than
// CONTRACT section 10's "one claim statement + one completion": MySQL cannot
// both decide and report in one statement. The other shapes cost more for
// the common outcomes: a claim transaction (START TRANSACTION, SELECT ...
// FOR UPDATE, INSERT or UPDATE, COMMIT) is 4 round trips for every outcome,
// replays included, and INSERT ... ON DUPLICATE KEY UPDATE needs a
// transaction and a read-back too.
//
// Every statement on the request path is a server-side prepared statement,
// prepared on first use on each pooled connection (COM_STMT_PREPARE, once per
// connection) and executed with one round trip after that. Preparing is lazy because
// MySQL checks the table at prepare time and New runs before Migrate.
//
// # Time
//
// Every time is the database's: UTC_TIMESTAMP(6) plus ClockOffset
// ("UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"), stored in DATETIME(6)
// columns, which carry no time zone, so neither the session's time_zone nor
// the application host's clock or zone moves anything. Times travel between
// Go and MySQL as integer microseconds since 1970-01-01 00:00:00 UTC
// (TIMESTAMPDIFF / + INTERVAL), never as DATETIME values, so the pool's
// parseTime and loc settings do not matter either. LeaseLeft is
// TIMESTAMPDIFF(MICROSECOND, now, locked_until), computed by the database.
// The claim decides against the now of its read and writes that same now
// (created_at, locked_until = now + lease, expires_at = now + retention), so
// a claim that waited on a row lock starts its lease a little in the past.
//
// # Fenced writes and affected rows
//
// Heartbeat, Complete and Fail are single UPDATEs fenced by
// "WHERE scope = ? AND key = ? AND fencing_token = ? AND state = 'PROCESSING'";
// one affected row means the caller still owns the record. MySQL counts a
// row that an UPDATE leaves unchanged as not affected (unless the client sets
// CLIENT_FOUND_ROWS), which would make a heartbeat that lands on the same
// microsecond report a lost lease. Every fenced write therefore sets
// updated_at = GREATEST(now, updated_at + 1 microsecond): updated_at never
// goes back and always changes, so the count is right with either setting.
//
// # Limits
//
// scope, key and method are VARBINARY(255) (MaxScopeBytes, MaxKeyBytes,
// MaxMethodBytes); path and fingerprint are BLOBs (65535 bytes). Claim checks
// these bounds before it writes and returns an error wrapping ErrTooLong, so
// nothing is ever truncated, even on a pool whose sql_mode is not strict.
// Response bodies are LONGBLOB; the practical bound is the server's
// max_allowed_packet (16 MiB by default on MariaDB 10.11, 64 MiB on MySQL 8),
// which Open reads (a driver from New reads it on its first completion). A
// response whose headers and body do not fit in it is recorded as not stored,
// as if it exceeded idem's EngineOptions.Response.MaxBytes: the first caller gets it whole,
// a replay answers 410 response-not-stored, and the handler never runs
// again. A sealed one keeps its small seal tag (seal_tag, apart from the
// blob): the tag of the response stored without its blob, which the core
// checks, so its status stays authenticated. Keep EngineOptions.Response.MaxBytes (default 1 MiB) below it to have every
// response replayed.
//
// go-sql-driver does not watch the context while a COMMIT is on the wire, so
// a connection that stalls there blocks the request until TCP gives up
// (minutes), whatever idem's CompleteTimeout. Bound it with readTimeout and
// writeTimeout in the URL (mysql://...?readTimeout=30s&writeTimeout=30s),
// longer than the slowest statement your handlers run.
//
// # Migrations
//
// Migrate applies the embedded goose migrations (MySQL dialect), recording
// them in the table idem_schema_version, through idem's one migrator
// (idemdriver/idemmigrate), under the lease "migrate idem_schema_version"
// in the table idem_locks: a row written with the server's clock and
// replicated to every node of a Galera cluster (GET_LOCK would be local to
// one node: three processes starting at once, one per node, all migrated
// together and wedged the database), held by no connection. Processes
// sharing a database migrate one at a time, whichever node they use; a
// process that dies mid-migration leaves a lease that runs out within
// idemmigrate.DefaultLockTTL (30 s). The version table is created, and its
// version 0 row inserted if missing, under the lease: a version table
// without that row (a process killed between goose's CREATE TABLE and its
// INSERT, which MySQL commits apart) is repaired instead of failing
// "missing zero version migration" forever
// (TestMigrateAfterVersionTableWithoutZeroRow). MySQL commits each DDL
// statement on its own, so a migration that fails part-way leaves its
// earlier statements applied: Migrate then returns a *MigrateError that
// names the failed version, the failing statement and the last version
// applied.
//
// # Retention and maintenance
//
// The driver implements idemdriver.Purger, MaintenanceLocker, Inspector and
// Migrator, so retention.Maintainer and every command of cmd/idem but
// `partitions` (PostgreSQL's partitioned mode) work on MySQL. Every "now" is
// UTC_TIMESTAMP(6) plus the parameters' ClockOffset, as on the request path.
//
// A purge batch (PurgeExpired, and the maintenance lock's PurgeExpired) is
// one short READ COMMITTED transaction:
//
//	START TRANSACTION;
//	SELECT scope, `key` FROM idem_keys
//	 WHERE expires_at <= now - OlderThan
//	   AND NOT (state = 'PROCESSING' AND locked_until > now)
//	 ORDER BY expires_at LIMIT batch FOR UPDATE SKIP LOCKED;
//	DELETE FROM idem_keys WHERE (scope, `key`) IN ((X'..', X'..'), ...);
//	COMMIT;
//
// The SELECT walks the expires_at index from the oldest record and locks
// the rows it returns, skipping those that another transaction holds (a
// claim, a completion in a business transaction): the purge waits for no
// request, and a request waits for the purge at most until its batch
// commits. READ COMMITTED (as for business transactions, see Begin) matters:
// the locking read takes no gap locks, so new claims, whose expires_at
// lies past the range read, are never blocked by it (TestPurgeBlocksNoClaim
// shows that REPEATABLE READ would block them); and a row re-claimed
// meanwhile is checked on its latest version and left alone. MySQL's
// DELETE has no SKIP LOCKED and cannot take its rows from a locking
// subquery on its own table, hence the second statement, which deletes
// the locked rows through the primary key, at most 1000 keys per DELETE
// (written as hexadecimal literals: one round trip, no placeholder limit).
//
// The maintenance lock is the lease "maintainer" in idem_locks
// (idemmigrate.Leases): taking it is INSERT IGNORE of its row and an UPDATE
// that takes it when its lease has run out (locked_until <= now) and
// increments its fencing token; Refresh and Release compare the token. It
// holds no connection, so it survives a pooled or killed connection
// (TestMaintenanceLockOutlivesItsConnections), and on Galera two nodes'
// takes of the row conflict at certification: one maintainer across the
// cluster. Every purge batch of the lock renews the lease first, in the
// batch's transaction, which keeps the row locked (and certified against a
// concurrent take-over) until COMMIT: a holder whose lease was taken over
// deletes nothing. The lease lasts LockParams.TTL from each renewal.
//
// Statements per maintenance operation (counted on the wire by
// TestMaintenanceStatementBudget; on a pool from New, add one SET
// TRANSACTION before each START TRANSACTION):
//
//   - a purge batch: 4 (START TRANSACTION, SELECT ... FOR UPDATE SKIP
//     LOCKED, DELETE, COMMIT), one DELETE more per further 1000 records of
//     the batch; 3 when nothing is purgeable (no DELETE).
//   - CountExpired (purge --dry-run): 1 SELECT COUNT(*).
//   - TryLockMaintenance: 2 (INSERT IGNORE, UPDATE of the lease row), and
//     once per driver the lease table's existence check.
//   - Refresh: 1 (UPDATE of the lease row).
//   - Release: 1 (UPDATE of the lease row).
//   - a purge batch under the lock: the batch's statements and the lease's
//     renewal in its transaction (5, or 4 when nothing is purgeable).
//   - retention.Maintainer, per Interval: the leader's first cycle takes the lock
//     (2) and later cycles refresh it (1), then it purges batches until one
//     comes back short (5 each, 4 for an empty one); so a quiet leader costs
//     5 statements per Interval. A standby costs 2 per Interval (its failed
//     TryLockMaintenance).
//
// The Inspector: Now is 1 SELECT; Stats reads one snapshot, SET
// TRANSACTION ISOLATION LEVEL REPEATABLE READ, START TRANSACTION READ ONLY,
// an aggregate SELECT (a full scan), the top scopes' GROUP BY (another),
// ROLLBACK; Stuck is 1 SELECT, a range of the index on (state,
// locked_until), longest overdue first.
//
// The completer's read (idemdriver.AbandonedLister) is 1 SELECT: two
// ranges of the same index (PROCESSING up to now, every FAILED record),
// each record's steps looked up by idem_steps's primary key, sorted by
// updated_at (a filesort of the abandoned records read).
//
// Migrator runs idemmigrate's Status and Down under Migrate's lease; Status
// names the tables of an applied migration that are gone
// (idemdriver.Migration.Missing). goose's own MySQL store scans the applied time (a DATETIME
// written by CURRENT_TIMESTAMP in the session's time zone) into a
// time.Time, which fails without parseTime; this driver reads it as
// microseconds, converted from the session's time zone to UTC. Rolling back
// 00001_idem_keys.sql drops idem_keys with every record (no undo: MySQL
// commits DDL at once).
//
// # Tested on
//
// The conformance suite and this package's tests run against MariaDB 10.11
// (10.11.19).
// The SQL sticks to syntax that MySQL 8.0 documents as well (no RETURNING,
// no SET STATEMENT, no MariaDB-only functions), but it has not been run
// against a MySQL 8 server here. Error 1020 (MariaDB 11.6+ with
// innodb_snapshot_isolation) is handled but has not been provoked.
package idemmysql
