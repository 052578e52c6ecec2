package idemdrivertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/racetest"
	idemretention "github.com/idemgo/idem/retention"
)

// need returns d as T when it implements it. Otherwise the case fails when
// the harness declared the capability (required), and is skipped when not.
func need[T any](t *testing.T, d idemdriver.Driver, required bool) T {
	t.Helper()
	what := reflect.TypeFor[T]().String()
	v, ok := d.(T)
	if !ok {
		if required {
			t.Fatalf("the harness declares %s, but %T does not implement it", what, d)
		}
		t.Skipf("%T does not implement %s", d, what)
	}
	return v
}

// newWith returns a fresh driver of h, and the driver as T (see need; T is
// required when h declares Maintenance).
func newWith[T any](t *testing.T, h Harness) (idemdriver.Driver, T) {
	t.Helper()
	d := h.NewDriver(t)
	return d, need[T](t, d, h.Maintenance)
}

// at claims p with the database clock moved by offset.
func at(t *testing.T, d idemdriver.Driver, offset time.Duration, p idemdriver.ClaimParams) idemdriver.Record {
	t.Helper()
	p.ClockOffset = offset
	res := claim(t, d, p)
	require.True(t, res.Claimed, "claim %s/%s at %s", p.Scope, p.Key, offset)
	return res.Record
}

func completeAt(t *testing.T, d idemdriver.Driver, offset time.Duration, rec idemdriver.Record) {
	t.Helper()
	f := fence(rec)
	f.ClockOffset = offset
	require.True(t, complete(t, d, f, okResponse(`{"ok":true}`)))
}

func runRetention(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"RetentionPerRoute", retentionPerRoute},
		{"ClaimsAcrossMidnight", retentionClaimsAcrossMidnight},
		{"Purge", retentionPurge},
		{"FencedAcrossPurge", retentionFencedAcrossPurge},
		{"Inspector", retentionInspector},
		{"Migrator", retentionMigrator},
		{"MaintenanceLock", retentionMaintenanceLock},
		{"StaleLeaseTakeover", retentionStaleLeaseTakeover},
		{"TwoMaintainers", retentionTwoMaintainers},
		{"Partitions", retentionPartitions},
	})
}

// A Middleware per route group, each with its own Retention: the
// documented way to retain keys per route (docs/retention.md).
func retentionPerRoute(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	clock := &Clock{}
	store := Shift(d, clock)
	short, err := idem.NewMiddleware(store, idem.Options{Engine: idem.EngineOptions{Retention: time.Hour}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	long, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant}) // 24 h
	require.NoError(t, err)
	runs := map[string]*atomic.Int32{"/short": {}, "/long": {}}
	writes := checkWrites(t)
	handler := func(path string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs[path].Add(1)
			w.WriteHeader(http.StatusCreated)
			writes.printf(w, `{"run":%d}`, n)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /short", short.Handler(handler("/short")))
	mux.Handle("POST /long", long.Handler(handler("/long")))
	post := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, key)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, 201, post("/short", "k-short").Code)
	require.Equal(t, 201, post("/long", "k-long").Code)
	rs := record(t, d, "global", "k-short")
	require.Equal(t, time.Hour, rs.ExpiresAt.Sub(rs.CreatedAt))
	rl := record(t, d, "global", "k-long")
	require.Equal(t, 24*time.Hour, rl.ExpiresAt.Sub(rl.CreatedAt))

	clock.Advance(2 * time.Hour)
	again := post("/short", "k-short")
	require.Equal(t, 201, again.Code)
	require.Empty(t, again.Header().Get(idem.HeaderReplayed), "past its route's retention the key is a new request")
	replay := post("/long", "k-long")
	require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
	require.EqualValues(t, 2, runs["/short"].Load())
	require.EqualValues(t, 1, runs["/long"].Load())
}

// Claims racing across a UTC midnight: half see 23:59:59.999, half
// 00:00:00.001 of the next day (the database clock moved by ClockOffset).
// On a store partitioned by day their records would fall into two
// partitions; exactly one may win all the same.
func retentionClaimsAcrossMidnight(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	ctx := context.Background()
	// The database's now, read from a claim's created_at, and the local
	// monotonic clock at that moment: estimate() never runs ahead of the
	// database's clock, so an offset computed from it lands at or after
	// its target.
	probe := at(t, d, 0, params("acct", "probe", "b"))
	t0 := time.Now()
	estimate := func() time.Time { return probe.CreatedAt.Add(time.Since(t0)) }
	midnight := probe.CreatedAt.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	offsetTo := func(target time.Time) time.Duration { return target.Sub(estimate()) }

	// Even claimants see 23:59:59.999, odd ones 00:00:00.001.
	results, err := racetest.Race(racers, func(i int) (idemdriver.ClaimResult, error) {
		target := midnight.Add(-time.Millisecond)
		if i%2 == 1 {
			target = midnight.Add(time.Millisecond)
		}
		p := params("acct", "midnight", "b")
		p.ClockOffset = offsetTo(target)
		return d.Claim(ctx, p)
	})
	require.NoError(t, err)
	winners := 0
	var won idemdriver.Record
	for _, r := range results {
		if r.Claimed {
			winners++
			won = r.Record
		}
	}
	require.Equal(t, 1, winners, "exactly one claimant wins across midnight")
	for _, r := range results {
		require.Equal(t, won.FencingToken, r.Record.FencingToken, "every loser answers from the winner's record")
	}
	require.Less(t, won.CreatedAt.Sub(midnight).Abs(), 10*time.Second, "the race ran at the boundary")
	t.Logf("winner created at %s (midnight %s)", won.CreatedAt.Format(time.RFC3339Nano), midnight.Format(time.RFC3339))

	// A key first seen before midnight, answered after it: replay, 409,
	// 422. beforeMidnight retries with a wider margin in the unlikely case
	// that the claim reached the database more than a millisecond after
	// the estimate.
	beforeMidnight := func(key, body string, lease time.Duration) idemdriver.Record {
		for _, margin := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
			p := params("acct", fmt.Sprintf("%s-%s", key, margin), body)
			p.LeaseDuration = lease
			p.ClockOffset = offsetTo(midnight.Add(-margin))
			res := claim(t, d, p)
			require.True(t, res.Claimed)
			if res.Record.CreatedAt.Before(midnight) {
				return res.Record
			}
		}
		t.Fatal("could not claim before midnight")
		return idemdriver.Record{}
	}
	afterMidnight := func(rec idemdriver.Record, body string) idemdriver.ClaimResult {
		p := params("acct", rec.Key, body)
		p.ClockOffset = offsetTo(midnight.Add(time.Millisecond)) // at or after 00:00:00.001
		res := claim(t, d, p)
		return res
	}
	done := beforeMidnight("replay", "b", lease)
	f := fence(done)
	f.ClockOffset = offsetTo(midnight.Add(-time.Millisecond / 2))
	require.True(t, complete(t, d, f, okResponse(`{"id":"pay_1"}`)))
	replay := afterMidnight(done, "b")
	require.False(t, replay.Claimed)
	require.Equal(t, idemdriver.StateSucceeded, replay.Record.State)
	require.Equal(t, `{"id":"pay_1"}`, string(replay.Record.Response.Body))

	busy := beforeMidnight("in-flight", "b", time.Hour)
	inFlight := afterMidnight(busy, "b")
	require.False(t, inFlight.Claimed)
	require.Equal(t, busy.FencingToken, inFlight.Record.FencingToken)
	require.Greater(t, inFlight.Record.LeaseLeft, 50*time.Minute, "409 with the lease taken before midnight")

	reused := beforeMidnight("reused", "b", lease)
	other := afterMidnight(reused, "another body")
	require.False(t, other.Claimed, "422: the record from before midnight is found")
	require.Equal(t, fingerprint("b"), other.Record.Fingerprint)

	for _, rec := range []idemdriver.Record{done, busy, reused} {
		got := record(t, d, "acct", rec.Key)
		require.Equal(t, rec.FencingToken, got.FencingToken, "one record per key across midnight")
	}
}

func retentionPurge(t *testing.T, h Harness) {
	t.Parallel()
	d, purger := newWith[idemdriver.Purger](t, h)
	ctx := context.Background()
	keys := seedRetention(t, d)

	count := func(older time.Duration, offset time.Duration) int64 {
		n, err := purger.CountExpired(ctx, idemdriver.PurgeParams{OlderThan: older, ClockOffset: offset})
		require.NoError(t, err)
		return n
	}
	require.EqualValues(t, 4, count(0, 0), "expired records, the live lease excepted")
	require.EqualValues(t, 1, count(150*time.Minute, 0), "expired more than 2.5 h ago")

	_, err := purger.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 0})
	require.Error(t, err, "a batch must be bounded")
	n, err := purger.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10, OlderThan: 150 * time.Minute})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	requireGone(t, d, "acct", keys.expired3h)

	var batches []int64
	for {
		n, err := purger.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 2})
		require.NoError(t, err)
		batches = append(batches, n)
		if n < 2 {
			break
		}
	}
	require.Equal(t, []int64{2, 1}, batches, "bounded batches")
	for _, k := range []string{keys.expiredSucceeded, keys.expiredFailed, keys.expiredStale} {
		requireGone(t, d, "acct", k, k)
	}
	live := record(t, d, "acct", keys.expiredLive, "a PROCESSING record under a live lease is never purged")
	require.Equal(t, idemdriver.StateProcessing, live.State)
	record(t, d, "acct", keys.fresh)

	// The database clock decides: 2 h later the live lease has ended.
	n, err = purger.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10, ClockOffset: 2 * time.Hour})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	requireGone(t, d, "acct", keys.expiredLive)
	require.Zero(t, count(0, 0))
	require.EqualValues(t, 1, count(0, 25*time.Hour), "the fresh record expires after its retention")

	// A purged key names a new request.
	again := at(t, d, 0, params("acct", keys.expiredSucceeded, "other body"))
	require.Equal(t, 1, again.Attempts)
}

// A purged key starts its fencing tokens again at 1, so a stale owner
// from the purged record's life holds the token of the key's next
// record: its writes must still be refused (they are fenced on
// created_at too). Regression: the stale owner's completion landed on
// the new request's record, which then replayed the wrong response.
func retentionFencedAcrossPurge(t *testing.T, h Harness) {
	t.Parallel()
	d, purger := newWith[idemdriver.Purger](t, h)
	ctx := context.Background()
	if p, ok := d.(idemdriver.Partitioner); ok && p.Partitioned() {
		_, err := p.EnsurePartitions(ctx, idemdriver.PartitionParams{DaysAhead: 3, ClockOffset: -2 * 24 * time.Hour})
		require.NoError(t, err)
	}
	stale := at(t, d, -25*time.Hour, params("acct", "k", "first")) // its owner stalls, and the record expires
	n, err := purger.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 10})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	fresh := at(t, d, 0, params("acct", "k", "second"))
	require.Equal(t, stale.FencingToken, fresh.FencingToken, "a purged key starts its tokens again")

	f := fence(stale)
	require.False(t, wrote(t, d.Heartbeat, f), "the stale owner's heartbeat")
	require.False(t, complete(t, d, f, okResponse(`{"from":"stale"}`)), "the stale owner's completion")
	require.False(t, wrote(t, d.Fail, f), "the stale owner's failure")
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateProcessing, rec.State)
	require.Equal(t, fingerprint("second"), rec.Fingerprint)
	completeAt(t, d, 0, fresh)
}

func retentionInspector(t *testing.T, h Harness) {
	t.Parallel()
	d, insp := newWith[idemdriver.Inspector](t, h)
	ctx := context.Background()
	keys := seedRetention(t, d)
	at(t, d, 0, params("other", "k", "b"))

	now, err := insp.Now(ctx, 0)
	require.NoError(t, err)
	fresh := record(t, d, "acct", keys.fresh)
	require.WithinDuration(t, fresh.CreatedAt, now, 10*time.Second, "the database's clock")
	later, err := insp.Now(ctx, time.Hour)
	require.NoError(t, err)
	require.WithinDuration(t, now.Add(time.Hour), later, 10*time.Second)

	st, err := insp.Stats(ctx, idemdriver.StatsParams{TopScopes: 1})
	require.NoError(t, err)
	require.EqualValues(t, 7, st.Total)
	require.Equal(t, map[idemdriver.State]int64{
		idemdriver.StateProcessing: 3, idemdriver.StateSucceeded: 3, idemdriver.StateFailed: 1, idemdriver.StateUnknown: 0}, st.ByState)
	require.Equal(t, []idemdriver.ScopeCount{{Scope: "acct", Count: 6}}, st.TopScopes)
	require.EqualValues(t, 5, st.Expired, "every expired record, the live lease included")
	require.EqualValues(t, 1, st.Stuck)
	require.NotNil(t, st.Oldest)
	require.WithinDuration(t, now.Add(-27*time.Hour), *st.Oldest, 10*time.Second)
	require.WithinDuration(t, now, st.Now, 10*time.Second)

	stuck, err := insp.Stuck(ctx, idemdriver.StuckParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, stuck, 1)
	require.Equal(t, keys.expiredStale, stuck[0].Key)
	require.InDelta(t, (25*time.Hour - lease).Seconds(), stuck[0].Overdue.Seconds(), 10)
	// Later, the other PROCESSING records' leases run out too.
	stuck, err = insp.Stuck(ctx, idemdriver.StuckParams{Limit: 10, ClockOffset: 2 * time.Hour})
	require.NoError(t, err)
	require.Len(t, stuck, 3)
	require.Equal(t, keys.expiredStale, stuck[0].Key, "longest overdue first")
	stuck, err = insp.Stuck(ctx, idemdriver.StuckParams{Limit: 1, ClockOffset: 2 * time.Hour})
	require.NoError(t, err)
	require.Len(t, stuck, 1)
}

func retentionMigrator(t *testing.T, h Harness) {
	t.Parallel()
	_, mig := newWith[idemdriver.Migrator](t, h)
	list, err := mig.MigrationStatus(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, list)
	for i, m := range list {
		require.True(t, m.Applied, m.Name)
		require.NotNil(t, m.AppliedAt, m.Name)
		require.True(t, strings.HasSuffix(m.Name, ".sql"), m.Name)
		if i > 0 {
			require.Greater(t, m.Version, list[i-1].Version)
		}
	}
}

func retentionMaintenanceLock(t *testing.T, h Harness) {
	t.Parallel()
	d, locker := newWith[idemdriver.MaintenanceLocker](t, h)
	require.NotNil(t, h.SecondDriver, "Harness.SecondDriver is required for the maintenance cases")
	d2 := h.SecondDriver(t, d)
	locker2 := need[idemdriver.MaintenanceLocker](t, d2, true)
	ctx := context.Background()
	seedRetention(t, d)
	lp := idemdriver.LockParams{Holder: "test", TTL: time.Minute}

	l1, err := locker.TryLockMaintenance(ctx, lp)
	require.NoError(t, err)
	_, err = locker2.TryLockMaintenance(ctx, lp)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "one maintainer at a time")
	_, err = locker.TryLockMaintenance(ctx, lp)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "also within one process")
	require.NoError(t, l1.Refresh(ctx))
	n, err := l1.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 100})
	require.NoError(t, err)
	require.EqualValues(t, 4, n)

	require.NoError(t, l1.Release(ctx))
	require.NoError(t, l1.Release(ctx), "Release is idempotent")
	_, err = l1.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 100})
	require.ErrorIs(t, err, idemdriver.ErrLockLost)
	require.ErrorIs(t, l1.Refresh(ctx), idemdriver.ErrLockLost)
	var l2 idemdriver.MaintenanceLock
	require.Eventually(t, func() bool { // a released lease is free at once; Eventually kept from session locks
		l2, err = locker2.TryLockMaintenance(ctx, lp)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the lock is free once released: %v", err)

	// Past the lock's TTL (the clock moved 2 min): the lease lapses and
	// is taken over, and its old holder can then neither refresh nor
	// purge. (Before every driver's lock was a lease, a session lock
	// was still held here; never both.)
	l3, err := locker.TryLockMaintenance(ctx, idemdriver.LockParams{Holder: "later", TTL: time.Minute, ClockOffset: 2 * time.Minute})
	require.NoError(t, err)
	require.ErrorIs(t, l2.Refresh(ctx), idemdriver.ErrLockLost)
	_, err = l2.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 100, ClockOffset: 2 * time.Hour})
	require.ErrorIs(t, err, idemdriver.ErrLockLost)
	require.NoError(t, l3.Release(ctx))
	require.NoError(t, l2.Release(ctx))
}

// The lock holder stalls past its lease (the database clock moved past
// its TTL): another process takes the lock over with a greater fencing
// token, and the stale holder's Refresh and purge are refused and delete
// nothing, until it takes the lock again (with a greater token still).
func retentionStaleLeaseTakeover(t *testing.T, h Harness) {
	t.Parallel()
	d, locker := newWith[idemdriver.MaintenanceLocker](t, h)
	require.NotNil(t, h.SecondDriver, "Harness.SecondDriver is required for the maintenance cases")
	locker2 := need[idemdriver.MaintenanceLocker](t, h.SecondDriver(t, d), true)
	purger := need[idemdriver.Purger](t, d, true)
	ctx := context.Background()
	seedRetention(t, d)
	stale, err := locker.TryLockMaintenance(ctx, idemdriver.LockParams{Holder: "stale", TTL: time.Minute})
	require.NoError(t, err)
	_, err = locker2.TryLockMaintenance(ctx, idemdriver.LockParams{Holder: "early", TTL: time.Minute, ClockOffset: 59 * time.Second})
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "a live lease is not taken over")

	later := idemdriver.LockParams{Holder: "successor", TTL: time.Minute, ClockOffset: 61 * time.Second}
	successor, err := locker2.TryLockMaintenance(ctx, later)
	require.NoError(t, err, "a lease past its TTL is taken over")
	require.Greater(t, successor.FencingToken(), stale.FencingToken())
	require.ErrorIs(t, stale.Refresh(ctx), idemdriver.ErrLockLost)
	_, err = stale.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 100})
	require.ErrorIs(t, err, idemdriver.ErrLockLost)
	n, err := purger.CountExpired(ctx, idemdriver.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "the stale holder purged nothing")
	_, err = locker.TryLockMaintenance(ctx, later)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "the successor's lease is live")
	require.NoError(t, successor.Refresh(ctx))
	n, err = successor.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: 100})
	require.NoError(t, err)
	require.EqualValues(t, 4, n)

	require.NoError(t, stale.Release(ctx), "releasing a lost lock changes nothing")
	_, err = locker.TryLockMaintenance(ctx, later)
	require.ErrorIs(t, err, idemdriver.ErrLockHeld, "the stale holder's release did not free the successor's lease")
	require.NoError(t, successor.Release(ctx))
	again, err := locker.TryLockMaintenance(ctx, idemdriver.LockParams{Holder: "stale", TTL: time.Minute})
	require.NoError(t, err)
	require.Greater(t, again.FencingToken(), successor.FencingToken())
	require.NoError(t, again.Release(ctx))
}

// Two maintainers on one database (two pools, as two processes): their
// work never overlaps, and when the leader stops the other takes over.
func retentionTwoMaintainers(t *testing.T, h Harness) {
	t.Parallel()
	d, _ := newWith[idemdriver.MaintenanceLocker](t, h)
	require.NotNil(t, h.SecondDriver, "Harness.SecondDriver is required for the maintenance cases")
	_, partitioned := d.(idemdriver.Partitioner)
	partitioned = partitioned && d.(idemdriver.Partitioner).Partitioned()
	if !partitioned {
		for i := 0; i < 20; i++ {
			at(t, d, -25*time.Hour, params("acct", fmt.Sprintf("old-%d", i), "b"))
		}
	}
	w := &overlap{}
	stores := []*watchedStore{{Driver: d, w: w}, {Driver: h.SecondDriver(t, d), w: w}}
	var ms []*idemretention.Maintainer
	for i, s := range stores {
		m, err := idemretention.NewMaintainer(s, idemretention.Config{
			Interval: 2 * time.Millisecond, Batch: 3, Holder: fmt.Sprintf("m%d", i), LockTTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		t.Cleanup(m.Stop)
		ms = append(ms, m)
	}
	const enough = 30 // maintenance calls
	require.Eventually(t, func() bool { return stores[0].calls.Load()+stores[1].calls.Load() >= enough },
		30*time.Second, time.Millisecond)
	leader := 0
	if stores[1].calls.Load() > 0 {
		leader = 1
	}
	require.Zero(t, stores[1-leader].calls.Load(), "the standby did no maintenance")
	require.True(t, ms[leader].Stats().Leader)
	require.False(t, ms[1-leader].Stats().Leader)
	if !partitioned {
		purger := d.(idemdriver.Purger)
		require.Eventually(t, func() bool {
			n, err := purger.CountExpired(context.Background(), idemdriver.PurgeParams{})
			return err == nil && n == 0
		}, 30*time.Second, time.Millisecond)
	}

	ms[leader].Stop()
	stopped := stores[leader].calls.Load()
	require.Eventually(t, func() bool { return stores[1-leader].calls.Load() >= enough },
		30*time.Second, time.Millisecond, "the standby takes over")
	require.Equal(t, stopped, stores[leader].calls.Load(), "a stopped maintainer does nothing")
	require.True(t, ms[1-leader].Stats().Leader)
	require.EqualValues(t, 1, w.max.Load(), "never two maintainers at once")
	if !partitioned {
		require.EqualValues(t, 20, ms[0].Stats().Purged+ms[1].Stats().Purged)
	}
}

func retentionPartitions(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	parts, ok := d.(idemdriver.Partitioner)
	if !ok || !parts.Partitioned() {
		if h.Partitioned {
			t.Fatalf("the harness declares a partitioned store, but %T is not one", d)
		}
		t.Skip("not a partitioned store")
	}
	limiter := need[idemdriver.RetentionLimiter](t, d, true)
	_, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Retention: limiter.MaxRetention() + time.Hour}, Scope: idem.SingleTenant})
	require.Error(t, err, "a Retention past the partitions ahead is refused up front")
	ctx := context.Background()
	day := 24 * time.Hour

	list, err := parts.Partitions(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(list), 2, "Migrate creates today's partition and those ahead")
	now := at(t, d, 0, params("acct", "now", "b")).CreatedAt
	require.False(t, list[0].From.After(now))
	require.True(t, list[len(list)-1].From.After(now.Add(limiter.MaxRetention())), "partitions cover MaxRetention")
	for i, p := range list {
		require.Equal(t, day, p.To.Sub(p.From), p.Name)
		if i > 0 {
			require.Equal(t, list[i-1].To, p.From, "contiguous")
		}
	}
	created, err := parts.EnsurePartitions(ctx, idemdriver.PartitionParams{})
	require.NoError(t, err)
	require.Empty(t, created, "idempotent")
	created, err = parts.EnsurePartitions(ctx, idemdriver.PartitionParams{DaysAhead: 2, ClockOffset: 20 * day})
	require.NoError(t, err)
	require.Len(t, created, 3, "days 20 to 22 ahead")

	// Day +3: a record under a lease of 4 days (live until day +7); day
	// +4: a completed record; both expire a day later.
	at(t, d, 2*day, params("acct", "live", "b"))
	liveP := params("acct", "live-lease", "b")
	liveP.LeaseDuration = 4 * day
	liveRec := at(t, d, 3*day, liveP)
	doneRec := at(t, d, 4*day, params("acct", "done", "b"))
	completeAt(t, d, 4*day, doneRec)

	dry, err := parts.DropPartitions(ctx, idemdriver.PartitionParams{DryRun: true, ClockOffset: 6*day + time.Hour})
	require.NoError(t, err)
	require.NotEmpty(t, dry)
	for _, p := range dry {
		require.False(t, p.To.After(now.Add(6*day+time.Hour)), "only whole expired ranges: %s", p.Name)
		require.False(t, !p.From.After(liveRec.ExpiresAt) && p.To.After(liveRec.ExpiresAt),
			"the partition with a live lease is kept: %s", p.Name)
	}
	after, err := parts.Partitions(ctx)
	require.NoError(t, err)
	require.Equal(t, len(list)+3, len(after), "a dry run drops nothing")

	dropped, err := parts.DropPartitions(ctx, idemdriver.PartitionParams{ClockOffset: 6*day + time.Hour})
	require.NoError(t, err)
	require.Equal(t, names(dry), names(dropped))
	requireGone(t, d, "acct", "done", "dropped with its partition")
	requireGone(t, d, "acct", "live")
	got := record(t, d, "acct", "live-lease", "a partition holding a live lease is not dropped")
	require.Equal(t, liveRec.FencingToken, got.FencingToken)

	// Past the lease, it goes too; OlderThan holds partitions back.
	kept, err := parts.DropPartitions(ctx, idemdriver.PartitionParams{ClockOffset: 8 * day, OlderThan: 4 * day})
	require.NoError(t, err)
	require.Empty(t, kept)
	dropped, err = parts.DropPartitions(ctx, idemdriver.PartitionParams{ClockOffset: 8 * day})
	require.NoError(t, err)
	require.NotEmpty(t, dropped)
	requireGone(t, d, "acct", "live-lease")
}

func names(parts []idemdriver.Partition) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}

// retentionKeys names the records seedRetention writes in scope "acct".
type retentionKeys struct {
	expiredSucceeded, expiredFailed, expiredStale, expiredLive, expired3h, fresh string
}

// seedRetention writes, by moving the database clock back, records that
// expired 1 h ago (SUCCEEDED, PROCESSING past its lease, PROCESSING under a
// lease still live for 1 h), 2 h ago (FAILED) and 3 h ago (SUCCEEDED), and a
// fresh SUCCEEDED record; 6 records. On a partitioned store it first creates
// the partitions of the past days.
func seedRetention(t *testing.T, d idemdriver.Driver) retentionKeys {
	t.Helper()
	if p, ok := d.(idemdriver.Partitioner); ok && p.Partitioned() {
		_, err := p.EnsurePartitions(context.Background(), idemdriver.PartitionParams{DaysAhead: 3, ClockOffset: -2 * 24 * time.Hour})
		require.NoError(t, err)
	}
	k := retentionKeys{"exp-succeeded", "exp-failed", "exp-stale", "exp-live", "exp-3h", "fresh"}
	completeAt(t, d, -25*time.Hour, at(t, d, -25*time.Hour, params("acct", k.expiredSucceeded, "b")))
	failed := at(t, d, -26*time.Hour, params("acct", k.expiredFailed, "b"))
	f := fence(failed)
	f.ClockOffset = -26 * time.Hour
	require.True(t, wrote(t, d.Fail, f))
	at(t, d, -25*time.Hour, params("acct", k.expiredStale, "b"))
	live := params("acct", k.expiredLive, "b")
	live.LeaseDuration = 26 * time.Hour
	at(t, d, -25*time.Hour, live)
	completeAt(t, d, -27*time.Hour, at(t, d, -27*time.Hour, params("acct", k.expired3h, "b")))
	completeAt(t, d, 0, at(t, d, 0, params("acct", k.fresh, "b")))
	return k
}

// overlap counts maintenance calls in flight across maintainers.
type overlap struct{ active, max atomic.Int64 }

func (o *overlap) enter() func() {
	n := o.active.Add(1)
	for {
		m := o.max.Load()
		if n <= m || o.max.CompareAndSwap(m, n) {
			break
		}
	}
	return func() { o.active.Add(-1) }
}

// watchedStore is a store whose maintenance calls (purge batches under the
// lock, partition maintenance) are counted, per store and in flight across
// stores.
type watchedStore struct {
	idemdriver.Driver
	w     *overlap
	calls atomic.Int64
}

func (s *watchedStore) TryLockMaintenance(ctx context.Context, p idemdriver.LockParams) (idemdriver.MaintenanceLock, error) {
	l, err := s.Driver.(idemdriver.MaintenanceLocker).TryLockMaintenance(ctx, p)
	if err != nil {
		return nil, err
	}
	return &watchedLock{MaintenanceLock: l, s: s}, nil
}

func (s *watchedStore) Partitioned() bool {
	p, ok := s.Driver.(idemdriver.Partitioner)
	return ok && p.Partitioned()
}

func (s *watchedStore) EnsurePartitions(ctx context.Context, p idemdriver.PartitionParams) ([]idemdriver.Partition, error) {
	defer s.w.enter()()
	s.calls.Add(1)
	return s.Driver.(idemdriver.Partitioner).EnsurePartitions(ctx, p)
}

func (s *watchedStore) DropPartitions(ctx context.Context, p idemdriver.PartitionParams) ([]idemdriver.Partition, error) {
	defer s.w.enter()()
	s.calls.Add(1)
	return s.Driver.(idemdriver.Partitioner).DropPartitions(ctx, p)
}

func (s *watchedStore) Partitions(ctx context.Context) ([]idemdriver.Partition, error) {
	return s.Driver.(idemdriver.Partitioner).Partitions(ctx)
}

type watchedLock struct {
	idemdriver.MaintenanceLock
	s *watchedStore
}

func (l *watchedLock) PurgeExpired(ctx context.Context, p idemdriver.PurgeParams) (int64, error) {
	defer l.s.w.enter()()
	l.s.calls.Add(1)
	return l.MaintenanceLock.PurgeExpired(ctx, p)
}
