package idemdriver

import (
	"context"
	"errors"
	"time"
)

// The optional interfaces below are what retention and the operator's tools
// (retention.Maintainer, cmd/idem) need from a driver beyond the claim protocol.
// A driver implements them on the same value as Driver; the core and the CLI
// find them with a type assertion, so a driver without them still serves
// requests. The conformance suite (idemdrivertest) runs their cases when a
// driver implements them, and fails a driver whose harness declares them
// (Harness.Maintenance, Harness.Partitioned) but lacks one.
//
// As everywhere in this package, every "now" is the database's clock plus
// the parameters' ClockOffset (tests only; zero in production).

// ErrLockHeld is returned by MaintenanceLocker.TryLockMaintenance when
// another process (or another lock value in this one) holds the
// maintenance lock.
var ErrLockHeld = errors.New("idemdriver: the maintenance lock is held by another process")

// ErrLockLost is returned by MaintenanceLock methods once the lock is no
// longer held: its lease ran out and another process took it, or it was
// released. The holder must stop maintaining and try to lock again.
var ErrLockLost = errors.New("idemdriver: the maintenance lock was lost")

// ErrNotPartitioned is returned by the Partitioner methods of a store whose
// idem_keys table is not partitioned.
var ErrNotPartitioned = errors.New("idemdriver: idem_keys is not partitioned")

// Maintainable is the set of optional interfaces that every driver idem
// ships (idempgx, idemmysql, idemsqlite) implements beside Driver:
// retention (Purger, MaintenanceLocker), the operator's reads (Inspector)
// and migrations (Migrator). Such a driver states it at compile time with
//
//	var _ idemdriver.Maintainable = (*Driver)(nil)
type Maintainable interface {
	Driver
	Purger
	MaintenanceLocker
	Inspector
	Migrator
}

// PurgeParams select the records a purge removes.
type PurgeParams struct {
	// Limit is the most records one PurgeExpired call deletes (one batch,
	// one short transaction). Must be positive. CountExpired ignores it.
	Limit int
	// OlderThan is the grace period past expiry: a record is purged when
	// expires_at <= now - OlderThan. Zero purges every expired record;
	// negative values are treated as zero.
	OlderThan time.Duration
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// Purger deletes expired records (expires_at = the latest claim's now +
// retention) in bounded batches.
type Purger interface {
	// PurgeExpired deletes at most p.Limit records whose expires_at <=
	// now - p.OlderThan, in one short transaction that waits for no row lock
	// (rows locked by a concurrent claim are skipped, and left for a later
	// batch). It never deletes a PROCESSING record whose lease is still
	// live (locked_until > now), even when it has expired. It returns how
	// many records it deleted; fewer than p.Limit means that nothing more was
	// purgeable when it ran.
	PurgeExpired(ctx context.Context, p PurgeParams) (int64, error)

	// CountExpired counts the records that PurgeExpired would delete, over
	// all batches (p.Limit is ignored), for a dry run. On a large table it
	// scans the expires_at index range it counts.
	CountExpired(ctx context.Context, p PurgeParams) (int64, error)
}

// LockParams configure one attempt to take the maintenance lock.
type LockParams struct {
	// Name names the lock: one holder at a time per name. "" is the
	// retention maintainer's; the completer (package completer) holds
	// "completer". A lock of another name elects only: its PurgeExpired is
	// the maintainer's all the same, and its holder should not call it.
	Name string
	// Holder names the process asking, for operators (host:pid or any
	// string); stored in the lease row.
	Holder string
	// TTL is how long the lease stays held without a Refresh, so a process
	// that dies without releasing it is replaced after at most TTL. Must be
	// positive.
	TTL time.Duration
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// MaintenanceLocker elects the one maintainer among all processes that
// share a database: at most one MaintenanceLock is held at a time per
// idem_keys table. Every driver of this module implements it with a lease
// row (idemdriver/idemmigrate.Leases): the database's clock, a fencing
// token, compare-and-set renewal and release, and no session-scoped lock,
// so the election holds behind a transaction pooler and across the nodes
// of a Galera cluster.
type MaintenanceLocker interface {
	// TryLockMaintenance takes the maintenance lock without waiting. It
	// returns ErrLockHeld when another holder has it, or another error when
	// the database could not answer.
	TryLockMaintenance(ctx context.Context, p LockParams) (MaintenanceLock, error)
}

// MaintenanceLock is the held maintenance lock. Its methods are not safe
// for concurrent use: one maintainer loop owns it.
type MaintenanceLock interface {
	// PurgeExpired is Purger.PurgeExpired run under the lock: it deletes
	// nothing and returns ErrLockLost when the lock is no longer held at the
	// moment it runs (the batch's transaction, or statement, renews the
	// lease first and is fenced by its token).
	PurgeExpired(ctx context.Context, p PurgeParams) (int64, error)
	// Refresh confirms that the lock is still held, extending its lease by
	// its TTL. It returns ErrLockLost when the lock is gone.
	Refresh(ctx context.Context) error
	// Release gives the lock up (idempotent). Another process may take the
	// lock right after.
	Release(ctx context.Context) error
	// FencingToken is the lock's tenure: every take of the lock, by any
	// process, gets a greater token than the one before, so a holder that
	// stalled past its TTL and was replaced holds a smaller token than its
	// successor (and its Refresh and PurgeExpired are refused).
	FencingToken() int64
}

// StatsParams shape a Stats call.
type StatsParams struct {
	// TopScopes is how many scopes, largest first, Stats.TopScopes lists.
	// Zero lists none.
	TopScopes int
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// ScopeCount is the number of records of one scope.
type ScopeCount struct {
	Scope string
	Count int64
}

// Stats summarizes the stored records, measured against the database's
// clock (Now). Every count is exact, so Stats reads the whole table: an
// operator's command, not a request-path call.
type Stats struct {
	// Now is the database's clock when the counts were taken.
	Now time.Time
	// Total is the number of stored records, expired ones included.
	Total int64
	// ByState counts the records per state (every state present, zero or not).
	ByState map[State]int64
	// TopScopes lists the StatsParams.TopScopes scopes with the most
	// records, largest first (ties by scope name).
	TopScopes []ScopeCount
	// Oldest is the smallest created_at, nil when there is no record.
	Oldest *time.Time
	// Expired counts the records past expires_at that are not purged yet.
	Expired int64
	// Stuck counts the PROCESSING records past their lease (locked_until <= Now).
	Stuck int64
	// Damaged counts the PROCESSING records without a lease bound
	// (Record.Damaged, locked_until NULL), which no request takes over.
	Damaged int64
}

// StuckParams shape a Stuck call.
type StuckParams struct {
	// Limit is the most records returned, longest overdue first. Must be positive.
	Limit int
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// StuckRecord is a PROCESSING record whose lease ran out: its owner died or
// stalled, and the next request with its key will take it over. Or a
// damaged one (Record.Damaged: no lease bound), which no request takes
// over (DecisionDamaged): an operator must release it.
type StuckRecord struct {
	Record
	// Overdue is now - locked_until: how long ago the lease ran out (>= 0);
	// 0 for a damaged record.
	Overdue time.Duration
}

// Inspector reads what operators need to see: the database's clock,
// summary counts and stuck executions. Every method only reads.
type Inspector interface {
	// Now returns the database's clock plus offset.
	Now(ctx context.Context, offset time.Duration) (time.Time, error)
	// Stats counts the records (see Stats).
	Stats(ctx context.Context, p StatsParams) (Stats, error)
	// Stuck lists the damaged PROCESSING records (locked_until NULL,
	// Record.Damaged) first, then those with locked_until <= now, longest
	// overdue first, at most p.Limit. It uses the index on locked_until of
	// PROCESSING records.
	Stuck(ctx context.Context, p StuckParams) ([]StuckRecord, error)
}

// Migration is one embedded schema migration and whether it is applied.
type Migration struct {
	Version int64
	// Name is the migration's file name (for example 00001_idem_keys.sql).
	Name    string
	Applied bool
	// AppliedAt is when it was applied (the migration tool's record, in
	// the database's clock), nil when pending.
	AppliedAt *time.Time
	// Missing names the tables this applied migration creates that are
	// gone from the database (dropped by hand, or a restore without them):
	// the version table says applied, the database does not. Empty when the
	// migration is pending or its tables exist.
	Missing []string
}

// Migrator is the rest of the migration life cycle; Driver.Migrate applies
// every pending migration. The drivers of this module implement both with
// idemdriver/idemmigrate, under a lease row that serializes every process
// sharing the database.
type Migrator interface {
	// MigrationStatus lists the embedded migrations, oldest first, with
	// whether each is applied, and for an applied one the tables it
	// created that are gone (Migration.Missing).
	MigrationStatus(ctx context.Context) ([]Migration, error)
	// MigrateDown rolls back the most recent applied migration and returns
	// it. It returns an error when no migration is applied, and one
	// wrapping ErrDropsRecords, rolling back nothing, when the rollback
	// would drop a table of records (idem_keys, idem_steps, a partition of
	// idem_keys) that holds rows (the first migration's drops idem_keys,
	// the steps' migration idem_steps), or idem_steps's at_most_once or the
	// UNKNOWN state while an at-most-once step is started without a result.
	MigrateDown(ctx context.Context) (Migration, error)
}

// ErrDropsRecords is MigrateDown's refusal of a rollback that would drop
// a table holding records or steps: each keeps a request from running
// again (an at-most-once step's start among them). The idem CLI's
// `migrate down --force` rolls back regardless (a driver's
// MigrateDownDroppingRecords).
var ErrDropsRecords = errors.New("idemdriver: the rollback would drop records or steps; a request they recorded would run again")

// Partition is one range partition of a partitioned idem_keys table.
type Partition struct {
	// Name is the partition's table name (idem_keys_pYYYYMMDD).
	Name string
	// From and To bound the expires_at values it holds: From <= expires_at < To (UTC days).
	From, To time.Time
	// Rows is the planner's estimate of its rows (pg_class.reltuples; -1 when
	// never analyzed), not an exact count.
	Rows int64
}

// PartitionParams shape partition maintenance.
type PartitionParams struct {
	// DaysAhead is how many days past today EnsurePartitions covers:
	// partitions for today through today+DaysAhead (UTC) exist afterwards.
	// Zero means the driver's configured default.
	DaysAhead int
	// OlderThan is the grace past a partition's end: DropPartitions drops a
	// partition only when To <= now - OlderThan. Zero drops every partition
	// whose whole range has expired.
	OlderThan time.Duration
	// DryRun makes DropPartitions report what it would drop without dropping.
	DryRun bool
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// Partitioner maintains the partitions of a store whose records are range
// partitioned by expires_at (idempgx.NewPartitioned). Dropping a partition
// removes its expired records without a DELETE: no dead tuples, no vacuum,
// a few kilobytes of WAL.
type Partitioner interface {
	// Partitioned reports whether the store uses partitions. When false,
	// the other methods return ErrNotPartitioned.
	Partitioned() bool
	// EnsurePartitions creates the missing partitions for today through
	// today + p.DaysAhead (UTC days of expires_at) and returns the ones it
	// created. Idempotent; safe to run from many processes at once.
	EnsurePartitions(ctx context.Context, p PartitionParams) ([]Partition, error)
	// DropPartitions drops the partitions whose whole range has expired
	// (To <= now - p.OlderThan) and that hold no PROCESSING record under a
	// live lease, and returns them (or, with p.DryRun, the ones it would drop).
	DropPartitions(ctx context.Context, p PartitionParams) ([]Partition, error)
	// Partitions lists the partitions, oldest first.
	Partitions(ctx context.Context) ([]Partition, error)
}

// RetentionLimiter is implemented by stores that cannot keep records past a
// bound: a partitioned store accepts a claim only when the partition of its
// expires_at exists. idem.New rejects a Config whose Retention exceeds
// MaxRetention.
type RetentionLimiter interface {
	// MaxRetention is the longest Retention a claim may ask for.
	MaxRetention() time.Duration
}

// ListParams select one page of records for Lister.List.
type ListParams struct {
	// State keeps the records in this state; empty keeps every state.
	State State
	// Scope keeps the records of this scope; empty keeps every scope.
	Scope string
	// Key keeps the records of this key (in every scope Scope allows);
	// empty keeps every key.
	Key string
	// AfterScope and AfterKey start the page after the record (AfterScope,
	// AfterKey) in (scope, key) order: give the last record of the previous
	// page. Both empty start at the first record (keys are never empty).
	AfterScope, AfterKey string
	// Limit is the most records returned. Must be positive.
	Limit int
	// ClockOffset is added to the database's clock (tests only).
	ClockOffset time.Duration
}

// Lister pages through the stored records for operators (cmd/idem's list,
// and inspect across scopes). It only reads.
type Lister interface {
	// List returns at most p.Limit records matching p, in (scope, key)
	// order, starting after (p.AfterScope, p.AfterKey). Fewer than p.Limit
	// records means the last page. Expired records not purged yet are
	// listed too (ExpiresAt tells them apart). LeaseLeft is measured
	// against the database's clock.
	List(ctx context.Context, p ListParams) ([]Record, error)
}

// RemoveParams name the record Remover.Remove deletes: as read, so that a
// claim or completion written since keeps it.
type RemoveParams struct {
	// FenceParams name the record's life (Scope, Key, FencingToken,
	// CreatedAt, as Get or List returned them); LeaseDuration and
	// ClockOffset are unused.
	FenceParams
	// State is the record's state as read.
	State State
}

// Remover deletes one record whatever its state, for operators (cmd/idem
// release): a FAILED record whose next request must run as new, or a
// SUCCEEDED one whose stored response is damaged (CONTRACT section 3's
// records are otherwise only removed by the purge, once expired). Driver's
// Release removes a PROCESSING record its owner holds; Remove is for the
// records no owner holds.
type Remover interface {
	// Remove deletes the record of p.Scope and p.Key when its fencing token,
	// created_at and state are still p's, and reports whether it did: false
	// when the record changed since it was read (a request claimed it) or is
	// gone.
	Remove(ctx context.Context, p RemoveParams) (bool, error)
}
