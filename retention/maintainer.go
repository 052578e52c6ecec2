// Package retention purges expired idempotency records (CONTRACT section 9,
// docs/retention.md): a Maintainer, elected among processes by the store's
// maintenance lock, deletes them in batches or drops expired partitions.
package retention

//lint:file-ignore ST1005 validation errors start with the Config field they name (Store, Retention, Interval...), as New joins them

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/seat"
)

// Defaults of Config.
const (
	DefaultInterval   = time.Minute
	DefaultBatch      = 1000
	DefaultMaxBatches = 1000
	// DefaultLockTTLMin is the least default LockTTL (see Config.LockTTL).
	DefaultLockTTLMin = 30 * time.Second
)

// ErrUnsupported is returned by NewMaintainer for a store that
// does not implement the driver interfaces the maintainer needs.
var ErrUnsupported = errors.New("idem: the store does not support maintenance")

// Config configures a Maintainer. The zero value of every field
// means its documented default.
type Config struct {
	// Interval is the time between two maintenance cycles, and between two
	// attempts of a standby process to become the maintainer. Default: 1 min.
	Interval time.Duration

	// Batch is the most records one purge statement deletes (one short
	// transaction). Default: 1000.
	Batch int

	// MaxBatches bounds the batches of one cycle; a cycle also ends at the
	// first batch that deletes fewer than Batch records. Default: 1000 (so
	// at most a million records per cycle with the default Batch).
	MaxBatches int

	// BatchPause is a pause between two batches of a cycle, which leaves
	// room to autovacuum and replicas under a large backlog. Default: none.
	BatchPause time.Duration

	// OlderThan is the grace past expiry: a record is purged when
	// expires_at <= now - OlderThan (database clock); on a partitioned store
	// a partition is dropped when its end <= now - OlderThan. Default: 0,
	// every expired record. Expired records are answered as new requests
	// whether purged or not (CONTRACT section 3); the grace only keeps them
	// around for inspection.
	OlderThan time.Duration

	// LockTTL is how long the maintenance lock (a lease row, see
	// idemdriver.MaintenanceLocker) outlives a maintainer that died without
	// releasing it; the holder renews it every cycle and between batches,
	// and every batch renews it in its own transaction. Default:
	// 3 × Interval, at least 30 s.
	LockTTL time.Duration

	// DaysAhead is how many days of partitions ahead of today each cycle
	// ensures, on a partitioned store. NewMaintainer refuses fewer than the
	// store's own (its MaxRetention plus one day). Default: the store's own
	// (see idempgx.PartitionConfig).
	DaysAhead int

	// Holder names this process in the lock, for operators. Default:
	// "hostname:pid".
	Holder string

	// OnCycle, when set, is called after every cycle, leader or standby,
	// from the maintainer's goroutine: hook metrics here. It must not block
	// for long. Default: none (Stats gives the running totals).
	OnCycle func(Cycle)

	// Logger receives leadership changes, each cycle's work (Info when it
	// removed something, Debug otherwise) and errors (Warn). Default:
	// slog.Default().
	Logger *slog.Logger

	// ClockOffset is added to the database's clock in every maintenance
	// statement. Tests only; zero in production.
	ClockOffset time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.MaxBatches = cmp.Or(c.MaxBatches, DefaultMaxBatches)
	if c.LockTTL == 0 {
		c.LockTTL = max(3*c.Interval, DefaultLockTTLMin)
	}
	c.Holder = cmp.Or(c.Holder, seat.Holder())
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("Interval %s must be positive", c.Interval))
	}
	if c.Batch <= 0 || c.MaxBatches <= 0 {
		errs = append(errs, errors.New("Batch and MaxBatches must be positive"))
	}
	if c.LockTTL <= 0 || c.BatchPause < 0 || c.OlderThan < 0 || c.DaysAhead < 0 {
		errs = append(errs, errors.New("LockTTL must be positive; BatchPause, OlderThan and DaysAhead not negative"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// Cycle reports one cycle of a Maintainer.
type Cycle struct {
	// Leader is true when this process held the maintenance lock for the
	// cycle (and did the work); false on a standby.
	Leader bool
	// Purged is the number of records deleted; Batches the statements that
	// deleted them.
	Purged  int64
	Batches int
	// PartitionsCreated and PartitionsDropped name the partitions created
	// and dropped (partitioned stores).
	PartitionsCreated []string
	PartitionsDropped []string
	// Duration is the cycle's wall time.
	Duration time.Duration
	// Err is the cycle's error, if any: the lock could not be taken or was
	// lost, or a statement failed. The next cycle starts afresh.
	Err error
}

// Stats are a Maintainer's running totals since Start.
type Stats struct {
	// Leader is true while this process holds the maintenance lock.
	Leader bool
	// Cycles counts every cycle; LeaderCycles those this process led.
	Cycles, LeaderCycles int64
	// Purged counts the records deleted, in Batches statements.
	Purged, Batches int64
	// PartitionsCreated and PartitionsDropped count partitions.
	PartitionsCreated, PartitionsDropped int64
	// Errors counts the cycles that ended with an error.
	Errors int64
}

// Maintainer removes expired records in the background: every Interval, the
// one process of many that holds the store's maintenance lock (elected by the
// database: see idemdriver.MaintenanceLocker) deletes expired records in
// batches of Batch, each its own short transaction, or, on a partitioned
// store, creates the partitions ahead and drops the fully expired ones. The
// other processes stand by and take over within one Interval when the
// leader stops (or within LockTTL when it dies). A leader that stalls past
// LockTTL is replaced, and its next purge is refused (the lease's fencing
// token has moved on), so two maintainers never purge at once.
//
// Create it with NewMaintainer, run it with Start, end it with Stop.
type Maintainer struct {
	cfg   Config
	seat  *seat.Seat             // the maintenance lock (its lease "maintainer")
	parts idemdriver.Partitioner // nil unless the store is partitioned

	loop seat.Loop

	cycles, leaderCycles, purged, batches, created, dropped, errs atomic.Int64
}

// NewMaintainer returns a maintainer of store's records. The store must
// implement idemdriver.MaintenanceLocker (idempgx, idemsqlite and idemmysql do); a
// partitioned store (idemdriver.Partitioner reporting Partitioned) is
// maintained by partitions instead of batched deletes. It returns
// ErrUnsupported (wrapped) for other stores, and an error naming
// every invalid field of cfg.
func NewMaintainer(store idemdriver.Driver, cfg Config) (*Maintainer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	locker, ok := store.(idemdriver.MaintenanceLocker)
	if !ok {
		return nil, fmt.Errorf("%w: %T does not implement idemdriver.MaintenanceLocker", ErrUnsupported, store)
	}
	m := &Maintainer{cfg: cfg, seat: seat.New(locker, idemdriver.LockParams{Holder: cfg.Holder, TTL: cfg.LockTTL,
		ClockOffset: cfg.ClockOffset}, "maintainer", cfg.Logger)}
	if p, ok := store.(idemdriver.Partitioner); ok && p.Partitioned() {
		m.parts = p
		// Claims need the partition of now + Retention, and Retention may
		// reach the store's MaxRetention: fewer days ahead would leave the
		// longest-lived claims without a partition (every one a 503).
		if lim, ok := store.(idemdriver.RetentionLimiter); ok && cfg.DaysAhead != 0 {
			need := int(lim.MaxRetention()/(24*time.Hour)) + 1
			if cfg.DaysAhead < need {
				return nil, fmt.Errorf("idem: invalid Config: DaysAhead %d is less than the store's %d days ahead: "+
					"claims with its longest retention (%s) would find no partition; leave DaysAhead 0 for the store's own",
					cfg.DaysAhead, need, lim.MaxRetention())
			}
		}
	}
	return m, nil
}

// Start runs the maintainer in a goroutine until ctx is done or Stop is
// called. The first cycle starts at once. It returns an error when called a
// second time: a stopped Maintainer does not start again (make a new one).
func (m *Maintainer) Start(ctx context.Context) error {
	if err := m.loop.Start(ctx, m.cfg.Interval, m.runCycle, func() { m.seat.Leave("stopped") }); err != nil {
		return fmt.Errorf("idem: Maintainer %w", err)
	}
	return nil
}

// Stop ends the maintainer, waits for its current statement to return, and
// releases the maintenance lock so that a standby takes over at its next
// attempt. It may be called more than once, and before Start.
func (m *Maintainer) Stop() { m.loop.Stop() }

// Stats returns the running totals.
func (m *Maintainer) Stats() Stats {
	return Stats{
		Leader: m.seat.Held(), Cycles: m.cycles.Load(), LeaderCycles: m.leaderCycles.Load(),
		Purged: m.purged.Load(), Batches: m.batches.Load(),
		PartitionsCreated: m.created.Load(), PartitionsDropped: m.dropped.Load(), Errors: m.errs.Load(),
	}
}

// runCycle runs one cycle and reports it, unless Stop cut it short.
func (m *Maintainer) runCycle(ctx context.Context) {
	c := m.cycle(ctx)
	if ctx.Err() != nil && c.Err != nil {
		return // stopped mid-cycle: not an error worth reporting
	}
	m.report(c)
}

func (m *Maintainer) cycle(ctx context.Context) (c Cycle) {
	start := time.Now()
	defer func() { c.Duration = time.Since(start) }()
	lead, err := m.seat.Take(ctx)
	if err != nil || !lead {
		c.Err = err
		return c
	}
	c.Leader = true
	if m.parts != nil {
		c.Err = m.partitions(ctx, &c)
		return c
	}
	for c.Batches < m.cfg.MaxBatches {
		if time.Since(m.seat.Refreshed()) > m.cfg.LockTTL/3 {
			if _, err := m.seat.Take(ctx); err != nil || m.seat.Lock() == nil {
				c.Err = err
				return c
			}
		}
		n, err := m.seat.Lock().PurgeExpired(ctx, idemdriver.PurgeParams{
			Limit: m.cfg.Batch, OlderThan: m.cfg.OlderThan, ClockOffset: m.cfg.ClockOffset})
		if err != nil {
			switch {
			case ctx.Err() != nil:
				// Stop cancelled the batch (the driver may have closed the
				// lock's connection to do it): a stop, not a lost election.
				m.seat.Leave("stopped")
			case errors.Is(err, idemdriver.ErrLockLost):
				m.seat.Leave("lock lost during a purge")
			}
			c.Err = err
			return c
		}
		c.Batches++
		c.Purged += n
		if n < int64(m.cfg.Batch) {
			return c
		}
		if m.cfg.BatchPause > 0 {
			select {
			case <-ctx.Done():
				c.Err = ctx.Err()
				return c
			case <-time.After(m.cfg.BatchPause):
			}
		}
	}
	return c
}

func (m *Maintainer) partitions(ctx context.Context, c *Cycle) error {
	p := idemdriver.PartitionParams{DaysAhead: m.cfg.DaysAhead, OlderThan: m.cfg.OlderThan, ClockOffset: m.cfg.ClockOffset}
	created, err := m.parts.EnsurePartitions(ctx, p)
	for _, part := range created {
		c.PartitionsCreated = append(c.PartitionsCreated, part.Name)
	}
	if err != nil {
		return err
	}
	dropped, err := m.parts.DropPartitions(ctx, p)
	for _, part := range dropped {
		c.PartitionsDropped = append(c.PartitionsDropped, part.Name)
	}
	return err
}

func (m *Maintainer) report(c Cycle) {
	m.cycles.Add(1)
	if c.Leader {
		m.leaderCycles.Add(1)
	}
	m.purged.Add(c.Purged)
	m.batches.Add(int64(c.Batches))
	m.created.Add(int64(len(c.PartitionsCreated)))
	m.dropped.Add(int64(len(c.PartitionsDropped)))
	log := m.cfg.Logger
	switch {
	case c.Err != nil:
		m.errs.Add(1)
		log.Warn("idem: maintainer: cycle failed", "leader", c.Leader, "purged", c.Purged, "err", c.Err)
	case c.Purged > 0 || len(c.PartitionsCreated) > 0 || len(c.PartitionsDropped) > 0:
		log.Info("idem: maintainer: cycle", "purged", c.Purged, "batches", c.Batches,
			"partitions_created", c.PartitionsCreated, "partitions_dropped", c.PartitionsDropped, "duration", c.Duration)
	default:
		log.Debug("idem: maintainer: cycle", "leader", c.Leader, "duration", c.Duration)
	}
	if m.cfg.OnCycle != nil {
		m.cfg.OnCycle(c)
	}
}
