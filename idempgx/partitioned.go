package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
)

// PartitionedSchemaVersionTable is the table in which a partitioned driver's
// migrations are recorded (a plain driver uses SchemaVersionTable).
const PartitionedSchemaVersionTable = "idem_schema_version_partitioned"

// DefaultDaysAhead is PartitionConfig.DaysAhead's default.
const DefaultDaysAhead = 7

// PartitionPrefix starts the name of every partition this package creates:
// idem_keys_pYYYYMMDD holds the records whose expires_at falls on that UTC
// day. Partitions named otherwise are left alone.
const PartitionPrefix = "idem_keys_p"

// Lock timeouts of partition DDL. Attaching an empty partition takes SHARE
// UPDATE EXCLUSIVE on idem_keys, which claims and completions (ROW EXCLUSIVE)
// do not conflict with; detaching CONCURRENTLY waits for the transactions
// that may still read the partition. Neither blocks the request path, but a
// DDL that waits too long gives up and is retried on the next run.
const (
	attachLockTimeout = 5 * time.Second
	detachLockTimeout = time.Minute
)

// PartitionConfig configures a partitioned driver.
type PartitionConfig struct {
	// DaysAhead is how many UTC days past today the partitions are created
	// by Migrate, EnsurePartitions (when its own DaysAhead is zero) and the
	// maintainer. A claim's record goes to the partition of its expires_at,
	// so the longest Retention it accepts is DaysAhead-1 days (MaxRetention):
	// one day of slack if partition maintenance stops for a day. Default:
	// DefaultDaysAhead (7 days: Retention up to 6 days).
	DaysAhead int
}

// NewPartitioned returns a driver on pool whose idem_keys table is range
// partitioned by expires_at, one partition per UTC day, created ahead by
// EnsurePartitions and dropped by DropPartitions once all their rows have
// expired (no DELETE, no vacuum). Migrate creates the partitioned table and
// today's through today+DaysAhead's partitions. A plain idem_keys table
// (New) cannot be migrated into a partitioned one in place: see
// docs/retention.md.
//
// PostgreSQL cannot enforce the uniqueness of (scope, key) across the
// partitions of a table partitioned by time, so the claim runs in one round
// trip of four statements, BEGIN; pg_advisory_xact_lock(hash of scope and
// key); the claim (a read across the partitions, then an UPDATE or INSERT);
// COMMIT: claims of one key are serialized whatever partition their
// expires_at falls in, and a retry that lands on the other side of midnight
// finds the first request's record.
func NewPartitioned(pool *pgxpool.Pool, cfg PartitionConfig) *Driver {
	if cfg.DaysAhead <= 0 {
		cfg.DaysAhead = DefaultDaysAhead
	}
	return &Driver{pool: pool, part: &cfg}
}

// IsPartitioned reports whether idem_keys in pool's search_path schema
// exists and is partitioned (created by NewPartitioned's Migrate). Use it to
// choose between New and NewPartitioned for an existing database. Often the
// first statement a process sends: behind a transaction pooler with a
// statement-caching exec mode, its error wraps ErrPoolerExecMode (see
// poolerErr), as Migrate's does.
func IsPartitioned(ctx context.Context, pool *pgxpool.Pool) (exists, partitioned bool, err error) {
	var kind *string
	err = pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass('idem_keys'))`).Scan(&kind)
	if err != nil || kind == nil {
		return false, false, poolerErr(err)
	}
	return true, *kind == "p", nil
}

// Partitioned implements idemdriver.Partitioner.
func (d *Driver) Partitioned() bool { return d.part != nil }

// MaxRetention implements idemdriver.RetentionLimiter: DaysAhead-1 days on a
// partitioned driver; no bound (the largest Duration) on a plain one.
func (d *Driver) MaxRetention() time.Duration {
	if d.part == nil {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(d.part.DaysAhead-1) * 24 * time.Hour
}

// nowTx is the partitioned claim's clock for its decision: the start of its
// transaction (taken at BEGIN, before it waits for the key's lock), moved by
// @offset. A claim that waited for the lock thus decides with the time it
// arrived, which can only make a lease or a record look younger than it is
// (a 409 rather than a takeover), never older. The lease it writes counts
// from the write itself (clock), so a wait never gives it a lease born
// expired.
const nowTx = `(transaction_timestamp() + @offset::bigint * interval '1 microsecond')`

// lockKeySQL takes the claim's lock: keys hold no space (visible ASCII), so
// "key scope" names one (scope, key) unambiguously.
var lockKeySQL = bind([]string{"scope", "key"}, `SELECT pg_advisory_xact_lock(hashtextextended(@key::text || ' ' || @scope::text, 0))`)

// claimPartitionedSQL runs under lockKeySQL, so no other claim of (scope,
// key) runs concurrently: "cur" reads the record across every partition; the
// UPDATE takes it when it can be claimed (as in claimSQL; it moves the row to
// another partition when its new expires_at falls on another day); the INSERT writes a
// new record when there is none (its times are the statement's, which starts
// after the key's lock is held). Before the UPDATE computes its new row,
// "locked" takes the row's lock (only when the record read is claimable: a
// replay, 409 or 422 writes nothing), waiting for a transaction that holds
// it, such as the old owner's business transaction: the lease is then
// written with the clock after that wait (clock), never born expired. (An
// UPDATE that waits on a row lock itself keeps the row it computed before
// the wait when the other transaction rolls back.) Heartbeats, completions and failures of the
// record's owner do not take the lock; the UPDATE re-checks its condition on
// the latest version of the row (READ COMMITTED), so one that commits in
// between is seen: the UPDATE then matches nothing while "cur" still shows
// the row claimable, and that stale row is not the answer (no row comes
// back, and claimPartitioned asks again).
var claimPartitionedSQL = bind(claimParams, `WITH `+curCTE(nowTx)+`, locked AS (
	SELECT 1 FROM idem_keys WHERE scope = @scope AND key = @key
		AND EXISTS (SELECT 1 FROM cur WHERE claimable)
	FOR UPDATE
), upd AS (
	UPDATE idem_keys AS k SET
		method = @method, path = @path, fingerprint = @fingerprint, state = 'PROCESSING', owner = @owner,
		fencing_token = k.fencing_token + 1,
		locked_until = `+clock+` + @lease::bigint * interval '1 microsecond',
		response_status = NULL, response_headers = NULL, response_body = NULL,
		response_body_stored = NULL, response_body_size = NULL, seal_key = '', seal_tag = NULL, request = NULL, completed_at = NULL,
		updated_at = `+nowTx+`,
		created_at = CASE WHEN `+partContinues+` THEN k.created_at ELSE `+nowTx+` END,
		expires_at = `+nowTx+` + @retention::bigint * interval '1 microsecond',
		attempts = CASE WHEN `+partContinues+` THEN k.attempts + 1 ELSE 1 END
	WHERE k.scope = @scope AND k.key = @key AND EXISTS (SELECT 1 FROM locked)
		AND NOT (k.state = 'PROCESSING' AND coalesce(k.locked_until > `+nowTx+`, true))
		AND (k.expires_at <= `+nowTx+` OR `+partContinues+`)
	RETURNING `+columns+`
), ins AS (
	INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
		locked_until, created_at, updated_at, expires_at, attempts, owner)
	SELECT @scope::text, @key::text, @method::text, @path::text, @fingerprint::bytea, 'PROCESSING', 1,
		`+now+` + @lease::bigint * interval '1 microsecond', `+now+`, `+now+`,
		`+now+` + @retention::bigint * interval '1 microsecond', 1, @owner::text
	WHERE NOT EXISTS (SELECT 1 FROM cur)
	RETURNING `+columns+`
)
SELECT true, *, coalesce((SELECT state = 'PROCESSING' FROM cur), false) AND attempts > 1 FROM upd
UNION ALL
SELECT true, *, false FROM ins
UNION ALL
SELECT false, `+columns+`, false FROM cur WHERE NOT claimable AND NOT EXISTS (SELECT 1 FROM upd)`)

// partContinues is idemsql.ClaimContinuesSQL for the partitioned claim's
// UPDATE, which compares with the request's parameters (no excluded row).
const partContinues = `(k.method = @method AND k.path = @path AND k.fingerprint = @fingerprint
		AND k.state IN ('FAILED', 'PROCESSING'))`

// ErrNoPartition is wrapped by the error of a claim, or of a resolution
// (ResolveStep), whose expires_at has no partition: partition maintenance
// has not run (EnsurePartitions, a retention.Maintainer, or `idem
// partitions ensure`), or the retention exceeds MaxRetention.
var ErrNoPartition = errors.New("idempgx: no partition of idem_keys for this expires_at")

// partitionErr wraps ErrNoPartition around PostgreSQL's error of a row
// whose expires_at no partition holds (23514, "no partition of relation"),
// saying what to do; other errors are returned as they are.
func (d *Driver) partitionErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition") {
		return fmt.Errorf("%w (run `idem partitions ensure` or a retention.Maintainer; Retention at most %s): %v",
			ErrNoPartition, d.MaxRetention(), err)
	}
	return err
}

// errClaimRaced: the claim statement returned no row (see claimBatch).
var errClaimRaced = errors.New("idempgx: the record changed during the claim")

// claimPartitioned sends BEGIN, the key's lock, the claim and COMMIT in one
// round trip (a pgx batch).
func (d *Driver) claimPartitioned(ctx context.Context, args []any) (idemdriver.ClaimResult, error) {
	var lastErr error
	for try := 0; try < maxClaimTries; try++ {
		res, err := d.claimBatch(ctx, args)
		switch {
		case err == nil:
			return res, nil
		case retryable(err), errors.Is(err, errClaimRaced):
			lastErr = err
			continue
		default:
			return res, d.partitionErr(err)
		}
	}
	return idemdriver.ClaimResult{}, fmt.Errorf("idempgx: claim gave no answer after %d tries: %w", maxClaimTries, lastErr)
}

func (d *Driver) claimBatch(ctx context.Context, args []any) (res idemdriver.ClaimResult, err error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lockKeySQL, args[0], args[1]) // scope, key: claimArgs's first two
	b.Queue(claimPartitionedSQL, args...)
	b.Queue("COMMIT")
	br := d.pool.SendBatch(ctx, b)
	// A failed statement leaves the transaction aborted and COMMIT skipped:
	// the pool then discards the connection (its transaction status is not
	// idle), which rolls the transaction back.
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err = br.Exec(); err != nil {
		return res, err
	}
	if _, err = br.Exec(); err != nil {
		return res, err
	}
	rows, err := br.Query()
	if err != nil {
		return res, err
	}
	res, found, err := scanClaim(rows)
	if err != nil {
		return res, err
	}
	if _, err = br.Exec(); err != nil {
		return res, err
	}
	if !found {
		// No row: the owner's heartbeat, completion or failure committed
		// between "cur" and the UPDATE (they do not take the key's lock), so
		// the row read is stale: ask again, with a new snapshot.
		return res, errClaimRaced
	}
	return res, nil
}

// scanClaim reads the claim statement's answer: at most one row.
func scanClaim(rows pgx.Rows) (res idemdriver.ClaimResult, found bool, err error) {
	defer rows.Close()
	for rows.Next() {
		if found {
			return res, found, errors.New("idempgx: more than one record for one (scope, key)")
		}
		res.Record, err = scanRecord(rows, &res.Claimed, &res.TookOver) // as in Claim
		found = true
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return res, found, err
}

// partitionName returns the name of the partition of the UTC day of t.
func partitionName(day time.Time) string { return PartitionPrefix + day.UTC().Format("20060102") }

// parsePartition reads the day of a partition name; ok is false for names
// this package did not create.
func parsePartition(name string) (idemdriver.Partition, bool) {
	day, err := time.Parse("20060102", strings.TrimPrefix(name, PartitionPrefix))
	if err != nil || !strings.HasPrefix(name, PartitionPrefix) {
		return idemdriver.Partition{}, false
	}
	return idemdriver.Partition{Name: name, From: day, To: day.AddDate(0, 0, 1)}, true
}

func (d *Driver) dbNow(ctx context.Context, offset time.Duration) (time.Time, error) {
	var t time.Time
	err := d.pool.QueryRow(ctx, `SELECT statement_timestamp() + $1::bigint * interval '1 microsecond'`,
		offset.Microseconds()).Scan(&t)
	return t.UTC(), err
}

// EnsurePartitions implements idemdriver.Partitioner. Each missing
// partition is created as a table of its own (CREATE TABLE ... LIKE) and then
// attached (ALTER TABLE idem_keys ATTACH PARTITION), which takes only a SHARE
// UPDATE EXCLUSIVE lock on idem_keys: claims keep running meanwhile
// (CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE). Concurrent
// callers are serialized by a transaction-scoped advisory lock. It then
// builds the completer's index of FAILED records on the partitions that
// predate it (indexPartitions).
func (d *Driver) EnsurePartitions(ctx context.Context, p idemdriver.PartitionParams) ([]idemdriver.Partition, error) {
	if d.part == nil {
		return nil, idemdriver.ErrNotPartitioned
	}
	ahead := p.DaysAhead
	if ahead <= 0 {
		ahead = d.part.DaysAhead
	}
	now, err := d.dbNow(ctx, p.ClockOffset)
	if err != nil {
		return nil, err
	}
	today := now.Truncate(24 * time.Hour)
	var created []idemdriver.Partition
	for i := 0; i <= ahead; i++ {
		part, _ := parsePartition(partitionName(today.AddDate(0, 0, i)))
		ok, err := d.createPartition(ctx, part)
		if err != nil {
			return created, fmt.Errorf("idempgx: create partition %s: %w", part.Name, err)
		}
		if ok {
			created = append(created, part)
		}
	}
	if err := d.indexPartitions(ctx, p.ClockOffset); err != nil {
		return created, fmt.Errorf("idempgx: index partitions: %w", err)
	}
	return created, nil
}

// unindexedSQL lists the partitions of idem_keys without an index attached
// to the partitioned index idem_keys_failed (migrations_partitioned/00007,
// created ON ONLY idem_keys): those that existed before that migration; a
// partition attached since got its index at ATTACH. None before 00007.
var unindexedSQL = `SELECT c.relname::text,
		coalesce((SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = to_regclass(c.relname || '_failed')), true)
	FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	WHERE i.inhparent = to_regclass('idem_keys') AND to_regclass('idem_keys_failed') IS NOT NULL
		AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
			WHERE ii.inhparent = to_regclass('idem_keys_failed') AND x.indrelid = c.oid)`

// indexPartitions builds idem_keys_failed's index on every partition that
// has none (see unindexedSQL), CREATE INDEX CONCURRENTLY (claims and
// completions go on meanwhile), and attaches it: once every partition's is
// attached, PostgreSQL marks idem_keys_failed valid. An index left invalid
// by an interrupted build is dropped and built again. Builders are
// serialized by the lease "partitions index" in idem_locks (a build runs
// outside a transaction, as DropPartitions's DETACH does); a process that
// finds it held leaves the work to its holder.
func (d *Driver) indexPartitions(ctx context.Context, offset time.Duration) (err error) {
	todo, err := d.unindexed(ctx)
	if err != nil || len(todo) == 0 {
		return err
	}
	_, leases := d.db()
	lease, err := leases.TryAcquire(ctx, idemmigrate.LeaseParams{Name: "partitions index", Holder: idemmigrate.Holder(),
		TTL: 3 * detachLockTimeout, ClockOffset: offset})
	if errors.Is(err, idemdriver.ErrLockHeld) {
		return nil
	}
	if err != nil {
		return err
	}
	kept, stop := lease.Keep(ctx) // a build can outlast the TTL
	defer func() {
		err = errors.Join(err, stop())
		if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("releasing the lease: %w", rerr))
		}
	}()
	if todo, err = d.unindexed(kept); err != nil { // as they are under the lease
		return err
	}
	for _, part := range todo {
		index := pgx.Identifier{part.name + "_failed"}.Sanitize()
		stmts := []string{
			`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + index + ` ON ` + pgx.Identifier{part.name}.Sanitize() +
				` (created_at) WHERE state = 'FAILED'`,
			`ALTER INDEX idem_keys_failed ATTACH PARTITION ` + index,
		}
		if part.invalid {
			stmts = append([]string{`DROP INDEX CONCURRENTLY ` + index}, stmts...)
		}
		for _, stmt := range stmts {
			if _, err := d.pool.Exec(kept, stmt); err != nil {
				return fmt.Errorf("partition %s: %w", part.name, err)
			}
		}
	}
	return nil
}

// unindexedPartition is a row of unindexedSQL: a partition, and whether an
// index of the name indexPartitions gives it exists and is invalid.
type unindexedPartition struct {
	name    string
	invalid bool
}

// unindexed returns unindexedSQL's partitions.
func (d *Driver) unindexed(ctx context.Context) ([]unindexedPartition, error) {
	rows, err := d.pool.Query(ctx, unindexedSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (unindexedPartition, error) {
		var p unindexedPartition
		var valid bool
		err := row.Scan(&p.name, &valid)
		p.invalid = !valid
		return p, err
	})
}

// createPartition creates and attaches part unless it exists; it reports
// whether it created it.
func (d *Driver) createPartition(ctx context.Context, part idemdriver.Partition) (bool, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	// After Commit a no-op; after a failure, that failure is the error to
	// report, and pgx closes a connection whose rollback fails.
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idem partitions ' || current_schema(), 0))`); err != nil {
		return false, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, part.Name).Scan(&exists); err != nil || exists {
		return false, err
	}
	ident := pgx.Identifier{part.Name}.Sanitize()
	for _, stmt := range []string{
		fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, attachLockTimeout.Milliseconds()),
		`CREATE TABLE ` + ident + ` (LIKE idem_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		`ALTER TABLE idem_keys ATTACH PARTITION ` + ident + ` FOR VALUES FROM ('` +
			part.From.Format(time.RFC3339) + `') TO ('` + part.To.Format(time.RFC3339) + `')`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	return true, tx.Commit(ctx)
}

// Partitions implements idemdriver.Partitioner.
func (d *Driver) Partitions(ctx context.Context) ([]idemdriver.Partition, error) {
	if d.part == nil {
		return nil, idemdriver.ErrNotPartitioned
	}
	parts, _, err := d.partitions(ctx)
	return parts, err
}

// partitions lists this package's partitions, oldest first, and the names of
// those whose DETACH CONCURRENTLY was interrupted (pending).
func (d *Driver) partitions(ctx context.Context) ([]idemdriver.Partition, map[string]bool, error) {
	rows, err := d.pool.Query(ctx, `SELECT c.relname::text, c.reltuples::bigint, i.inhdetachpending
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass('idem_keys')`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var parts []idemdriver.Partition
	pending := map[string]bool{}
	for rows.Next() {
		var (
			name string
			n    int64
			pend bool
		)
		if err := rows.Scan(&name, &n, &pend); err != nil {
			return nil, nil, err
		}
		part, ok := parsePartition(name)
		if !ok {
			continue
		}
		part.Rows = n
		parts = append(parts, part)
		pending[name] = pend
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].From.Before(parts[j].From) })
	return parts, pending, nil
}

// DropPartitions implements idemdriver.Partitioner. A partition is dropped
// when its whole range has expired (To <= now - OlderThan): no claim can put
// a row into it any more (a new record's expires_at is in the future, and a
// re-claimed expired record moves to the partition of its new expires_at).
// It is skipped, and dropped on a later run, while it holds a PROCESSING
// record under a live lease. Each drop is ALTER TABLE idem_keys DETACH
// PARTITION ... CONCURRENTLY (SHARE UPDATE EXCLUSIVE on idem_keys; it waits
// for the transactions that may read the partition, and blocks none), then
// DROP TABLE of the detached table; droppers are serialized by a lease in
// idem_locks. A detach that was interrupted is
// finished (DETACH PARTITION ... FINALIZE) before the drop. A lease that
// cannot be released at the end is reported with the partitions dropped
// (the next dropper waits until it runs out, at most 3 x detachLockTimeout).
// Unless DryRun, it then sweeps the steps of record lives that no record
// holds any more, DaysAhead days after they started (see sweepStepsSQL),
// whether or not a partition was dropped.
func (d *Driver) DropPartitions(ctx context.Context, p idemdriver.PartitionParams) (_ []idemdriver.Partition, err error) {
	if d.part == nil {
		return nil, idemdriver.ErrNotPartitioned
	}
	now, err := d.dbNow(ctx, p.ClockOffset)
	if err != nil {
		return nil, err
	}
	parts, pending, err := d.partitions(ctx)
	if err != nil {
		return nil, err
	}
	cutoff := now.Add(-max(p.OlderThan, 0))
	var doomed []idemdriver.Partition
	for _, part := range parts {
		if part.To.After(cutoff) {
			continue
		}
		var live bool
		err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{part.Name}.Sanitize()+`
			WHERE state = 'PROCESSING' AND locked_until > $1)`, now).Scan(&live)
		if err != nil {
			return nil, fmt.Errorf("idempgx: partition %s: %w", part.Name, err)
		}
		if !live {
			doomed = append(doomed, part)
		}
	}
	if p.DryRun {
		return doomed, nil
	}
	if len(doomed) == 0 {
		return nil, d.sweepSteps(ctx, p.ClockOffset)
	}
	// Droppers are serialized by the lease "partitions drop" in idem_locks
	// (a row, not a session advisory lock: DETACH ... CONCURRENTLY cannot
	// run in a transaction, so no transaction-scoped lock can cover it, and
	// a session lock would stay on a pooled server connection behind a
	// transaction pooler). Each DETACH runs on the pool, bounded by
	// detachLockTimeout through its context (a session SET lock_timeout
	// would leak to the pooler's other clients).
	_, leases := d.db()
	lease, err := leases.Acquire(ctx, idemmigrate.LeaseParams{Name: "partitions drop", Holder: idemmigrate.Holder(),
		TTL: 3 * detachLockTimeout, ClockOffset: p.ClockOffset}, detachLockTimeout)
	if err != nil {
		return nil, fmt.Errorf("idempgx: drop partitions: %w", err)
	}
	defer func() {
		if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("idempgx: drop partitions: releasing the lease: %w", rerr))
		}
	}()
	c := d.pool
	var dropped []idemdriver.Partition
	for _, part := range doomed {
		ident := pgx.Identifier{part.Name}.Sanitize()
		detach := `ALTER TABLE idem_keys DETACH PARTITION ` + ident + ` CONCURRENTLY`
		if pending[part.Name] {
			detach = `ALTER TABLE idem_keys DETACH PARTITION ` + ident + ` FINALIZE`
		}
		dctx, cancel := context.WithTimeout(ctx, detachLockTimeout)
		_, err := c.Exec(dctx, detach)
		cancel()
		if err != nil {
			return dropped, fmt.Errorf("idempgx: detach partition %s: %w", part.Name, err)
		}
		if _, err := c.Exec(ctx, `DROP TABLE `+ident); err != nil {
			return dropped, fmt.Errorf("idempgx: drop partition %s: %w", part.Name, err)
		}
		dropped = append(dropped, part)
	}
	return dropped, d.sweepSteps(ctx, p.ClockOffset)
}

// Sweeping the steps no record holds any more (sweepStepsSQL): at most
// sweepBatches statements of sweepBatch rows per DropPartitions.
const (
	sweepBatch   = 1000
	sweepBatches = 100
)

// sweepStepsSQL deletes one batch of steps whose record life is gone: its
// record was in a dropped partition, or the key has begun a new life since
// (a record deleted by a statement takes its steps with it: withStepsGone).
// It looks only at steps started before @before, oldest first through
// idem_steps_started_at, so that it does not walk the steps of the records
// that live: a life that started before @before and still holds its record
// (an UNKNOWN one, or a FAILED one claimed again and again) is seen and
// kept. Rows another sweep holds are skipped. A record's life is found
// through the primary key of every partition, whatever its expires_at.
var sweepStepsSQL = `WITH doomed AS (
	SELECT s.scope, s.key, s.created_at, s.name FROM idem_steps s
	WHERE s.started_at < @before
		AND NOT EXISTS (SELECT 1 FROM idem_keys k WHERE k.scope = s.scope AND k.key = s.key AND k.created_at = s.created_at)
	ORDER BY s.started_at
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
DELETE FROM idem_steps s USING doomed d
WHERE s.scope = d.scope AND s.key = d.key AND s.created_at = d.created_at AND s.name = d.name`

// sweepSteps deletes the steps of lives that started DaysAhead days or more
// before the database's now moved by offset and hold no record (see
// sweepStepsSQL). No record can come back to such a life: a claim gives a
// new record a new created_at.
func (d *Driver) sweepSteps(ctx context.Context, offset time.Duration) error {
	now, err := d.dbNow(ctx, offset)
	if err != nil {
		return fmt.Errorf("idempgx: sweep steps: %w", err)
	}
	before := now.AddDate(0, 0, -d.part.DaysAhead)
	for range sweepBatches {
		tag, err := d.pool.Exec(ctx, sweepStepsSQL, pgx.NamedArgs{"before": before, "limit": sweepBatch})
		if err = stepErr(err); errors.Is(err, idemdriver.ErrSchemaTooOld) {
			return nil // no idem_steps yet: nothing to sweep
		}
		if err != nil {
			return fmt.Errorf("idempgx: sweep steps: %w", err)
		}
		if tag.RowsAffected() < sweepBatch {
			return nil
		}
	}
	return nil
}
