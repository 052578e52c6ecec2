package idempgx_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
)

// sqlTracer records the text of every statement sent.
type sqlTracer struct {
	mu  sync.Mutex
	sql []string
}

func (s *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, d.SQL)
	return ctx
}
func (s *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take, each shortened
// to its kind: "select" (a plain read), "insert" (a plain INSERT ... ON
// CONFLICT DO NOTHING), "claim" (the deciding statement: its CTE upserts)
// or the statement's first word.
func (s *sqlTracer) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kinds []string
	for _, q := range s.sql {
		q = strings.TrimSpace(q)
		switch {
		case strings.HasPrefix(q, "SELECT") && !strings.Contains(q, "INSERT"):
			kinds = append(kinds, "select")
		case strings.HasPrefix(q, "INSERT") && strings.Contains(q, "ON CONFLICT DO NOTHING") && !strings.Contains(q, "DO UPDATE"):
			kinds = append(kinds, "insert")
		case strings.HasPrefix(q, "WITH") && strings.Contains(q, "DO UPDATE"):
			kinds = append(kinds, "claim")
		default:
			kinds = append(kinds, strings.Fields(q)[0])
		}
	}
	s.sql = nil
	return kinds
}

// A claim's first statements in each order (Options.ClaimOrder, issue 21).
// Read first: the answer to an existing key that may not be claimed (a
// replay, 409, 422) is one plain SELECT, with no INSERT in it; a new key
// is the read and a plain INSERT. INSERT first: a new key is the INSERT
// alone; an existing key the INSERT, which meets it, and the read. In
// both, a key that may be claimed again (FAILED here) goes on to the
// deciding claim statement, and every decision is the same.
func TestClaimOrders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		order           idempgx.ClaimOrder
		first, existing []string
	}{
		{idempgx.ClaimReadFirst, []string{"select", "insert"}, []string{"select"}},
		{idempgx.ClaimInsertFirst, []string{"insert"}, []string{"insert", "select"}},
	} {
		t.Run(map[idempgx.ClaimOrder]string{idempgx.ClaimReadFirst: "read first", idempgx.ClaimInsertFirst: "insert first"}[tc.order], func(t *testing.T) {
			t.Parallel()
			tracer := &sqlTracer{}
			d := openDriverOrder(t, false, tracer, tc.order)
			checkClaimShapes(t, d, tracer, tc.first, tc.existing)
		})
	}
}

// checkClaimShapes claims one key through every decision on d, checking the
// statements each sends (first for a new key, existing for a key that may
// not be claimed; a re-claim adds the claim statement) and the records.
func checkClaimShapes(t *testing.T, d *idempgx.Driver, tracer *sqlTracer, first, existing []string) {
	ctx := context.Background()
	p := idemdriver.ClaimParams{Scope: "acct", Key: "shape", Method: "POST", Path: "/v1/payments", Fingerprint: []byte{1},
		LeaseDuration: 30 * time.Second, Retention: time.Hour}
	other := p
	other.Fingerprint = []byte{2}
	claim := func(p idemdriver.ClaimParams, want idemdriver.Decision, statements []string) idemdriver.ClaimResult {
		t.Helper()
		tracer.take()
		res, err := d.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, want.Claims(), res.Claimed, want.String())
		require.Equal(t, statements, tracer.take(), want.String())
		return res
	}

	first1 := claim(p, idemdriver.DecisionNew, first)
	require.EqualValues(t, 1, first1.Record.FencingToken)
	require.EqualValues(t, 1, first1.Record.Attempts)
	require.Equal(t, idemdriver.StateProcessing, first1.Record.State)
	require.Positive(t, first1.Record.LeaseLeft)
	// The record the INSERT returns (what the database decided, the rest
	// from the claim) is the record as stored.
	stored, err := d.Get(ctx, idemdriver.GetParams{Scope: p.Scope, Key: p.Key})
	require.NoError(t, err)
	require.InDelta(t, stored.LeaseLeft, first1.Record.LeaseLeft, float64(time.Second))
	stored.LeaseLeft = first1.Record.LeaseLeft
	require.Equal(t, stored, first1.Record)
	inFlight := claim(p, idemdriver.DecisionInFlight, existing)
	require.InDelta(t, stored.LeaseLeft, inFlight.Record.LeaseLeft, float64(time.Second))
	inFlight.Record.LeaseLeft = stored.LeaseLeft
	require.Equal(t, stored, inFlight.Record, "the read is the record as stored")
	claim(other, idemdriver.DecisionKeyReused, existing)

	fence := idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: 1, CreatedAt: first1.Record.CreatedAt}
	ok, err := d.Fail(ctx, fence)
	require.NoError(t, err)
	require.True(t, ok)
	again := claim(p, idemdriver.DecisionReclaim, append(slices.Clone(existing), "claim"))
	require.EqualValues(t, 2, again.Record.FencingToken)
	require.EqualValues(t, 2, again.Record.Attempts)
	require.True(t, again.Record.CreatedAt.Equal(first1.Record.CreatedAt), "a re-claim continues the record's life")

	fence.FencingToken = 2
	ok, err = d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence,
		Response: idemdriver.Response{Status: 201, Body: []byte(`{}`), BodyStored: true, BodySize: 2}})
	require.NoError(t, err)
	require.True(t, ok)
	replay := claim(p, idemdriver.DecisionReplay, existing)
	require.Equal(t, idemdriver.StateSucceeded, replay.Record.State)
	require.Equal(t, 201, replay.Record.Response.Status)
	require.Equal(t, `{}`, string(replay.Record.Response.Body))
	require.Equal(t, p.Scope, replay.Record.Scope)
	require.Equal(t, p.Key, replay.Record.Key)
	require.EqualValues(t, 2, replay.Record.FencingToken)
	require.NotNil(t, replay.Record.CompletedAt)
	claim(other, idemdriver.DecisionKeyReused, existing)
	// Past its retention the record may be claimed by another request: a
	// new life, through the claim statement.
	expired := other
	expired.ClockOffset = 2 * time.Hour
	renewed := claim(expired, idemdriver.DecisionNewLife, append(slices.Clone(existing), "claim"))
	require.EqualValues(t, 3, renewed.Record.FencingToken)
	require.EqualValues(t, 1, renewed.Record.Attempts)
}

// ClaimAdaptive (the default) sends the INSERT first on a new driver, reads
// first once most recent claims met an existing record, and goes back to
// the INSERT first once most met none: each switch within the window of
// recent claims it weighs.
func TestClaimOrderAdapts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tracer := &sqlTracer{}
	d := openDriver(t, false, tracer)
	p := func(key string) idemdriver.ClaimParams {
		return idemdriver.ClaimParams{Scope: "acct", Key: key, Method: "POST", Path: "/v1/payments", Fingerprint: []byte{1},
			LeaseDuration: 30 * time.Second, Retention: time.Hour}
	}
	claim := func(key string) []string {
		t.Helper()
		tracer.take()
		_, err := d.Claim(ctx, p(key))
		require.NoError(t, err)
		return tracer.take()
	}
	require.Equal(t, []string{"insert"}, claim("new-0"), "a new driver sends the INSERT first")
	// A run of duplicates of the key in flight (409s): the INSERT first
	// until they are the majority, then the read alone.
	n := 0
	for ; n < 40 && !slices.Equal(claim("new-0"), []string{"select"}); n++ {
	}
	require.Less(t, n, 40, "the order never turned to the read first")
	require.Positive(t, n, "the first duplicate after a new key still sends the INSERT first")
	for range 5 {
		require.Equal(t, []string{"select"}, claim("new-0"), "it stays read first while duplicates come")
	}
	// A run of new keys: read first until they are the majority.
	n = 0
	for ; n < 40 && !slices.Equal(claim(fmt.Sprint("new-", n+1)), []string{"insert"}); n++ {
	}
	require.Less(t, n, 40, "the order never turned back to the INSERT first")
	require.Positive(t, n)
}

// Claims in both orders race for the same keys, on one table: a new key,
// a FAILED record, a PROCESSING record past its lease and a record past
// its retention are each won by exactly one claim, whichever order each
// claimer reads in, and every loser is answered from the winner's claim.
// Both orders meet here only at the claim statement's decision, so a race
// the read or the INSERT let through would show as two winners.
func TestClaimOrdersRaceOnOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drivers := openDrivers(t, false, nil, idempgx.ClaimReadFirst, idempgx.ClaimInsertFirst)
	const keys, claimers = 25, 8
	lease, retention := 30*time.Second, time.Hour
	params := func(key string, fp byte, offset time.Duration) idemdriver.ClaimParams {
		return idemdriver.ClaimParams{Scope: "acct", Key: key, Method: "POST", Path: "/v1/payments", Fingerprint: []byte{fp},
			LeaseDuration: lease, Retention: retention, ClockOffset: offset}
	}
	// race claims p with claimers at once, half in each order, and returns
	// the winner's result after checking there is exactly one.
	race := func(p idemdriver.ClaimParams, want idemdriver.Decision) idemdriver.ClaimResult {
		t.Helper()
		results, errs := atOnce(claimers, func(i int) (idemdriver.ClaimResult, error) {
			return drivers[i%len(drivers)].Claim(ctx, p)
		})
		var won []idemdriver.ClaimResult
		for i, res := range results {
			require.NoError(t, errs[i], "claimer %d of %s", i, p.Key)
			if res.Claimed {
				won = append(won, res)
			}
		}
		require.Len(t, won, 1, "%s: %s is won by one claim", p.Key, want)
		for i, res := range results {
			require.Equal(t, won[0].Record.FencingToken, res.Record.FencingToken, "claimer %d of %s sees the winner's claim", i, p.Key)
			require.Equal(t, idemdriver.StateProcessing, res.Record.State, "claimer %d of %s", i, p.Key)
		}
		require.Equal(t, want == idemdriver.DecisionTakeOver, won[0].TookOver, "%s", p.Key)
		return won[0]
	}
	fail := func(res idemdriver.ClaimResult) {
		t.Helper()
		ok, err := drivers[0].Fail(ctx, idemdriver.FenceParams{Scope: res.Record.Scope, Key: res.Record.Key,
			FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt})
		require.NoError(t, err)
		require.True(t, ok)
	}
	for k := range keys {
		key := fmt.Sprintf("race-%d", k)
		first := race(params(key, 1, 0), idemdriver.DecisionNew)
		require.EqualValues(t, 1, first.Record.FencingToken)
		fail(first)
		again := race(params(key, 1, 0), idemdriver.DecisionReclaim)
		require.EqualValues(t, 2, again.Record.FencingToken)
		// The re-claim never completes: past its lease, a takeover.
		taken := race(params(key, 1, lease+time.Second), idemdriver.DecisionTakeOver)
		require.EqualValues(t, 3, taken.Record.FencingToken)
		// Past its retention, another request's new life.
		renewed := race(params(key, 2, retention+lease+time.Minute), idemdriver.DecisionNewLife)
		require.EqualValues(t, 4, renewed.Record.FencingToken)
		require.EqualValues(t, 1, renewed.Record.Attempts)
	}
}

// The one-commit claim (ClaimTx) in both orders, racing for a new key and
// for a record past its retention: one claim wins and commits its
// completion, and every other is answered the committed record (a
// replay), after waiting on the winner's row lock or reading it committed.
func TestClaimTxOrdersRaceOnOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drivers := openDrivers(t, false, nil, idempgx.ClaimReadFirst, idempgx.ClaimInsertFirst)
	const keys, claimers = 25, 8
	retention := time.Hour
	race := func(p idemdriver.ClaimParams) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, time.Minute) // a claim that hangs fails the test
		defer cancel()
		results, errs := atOnce(claimers, func(i int) (idemdriver.ClaimResult, error) {
			res, tx, err := drivers[i%len(drivers)].ClaimTx(ctx, p, 30*time.Second)
			if err == nil && res.Claimed {
				var ok bool
				ok, err = tx.Complete(ctx, idemdriver.CompleteParams{
					FenceParams: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
					Response:    idemdriver.Response{Status: 201, Body: fmt.Appendf(nil, "%d", i), BodyStored: true, BodySize: 1}})
				if err == nil && !ok {
					err = fmt.Errorf("claimer %d: its completion was fenced out", i)
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx) // the connection back to the pool, whatever failed
				}
			}
			return res, err
		})
		winner := -1
		for i, res := range results {
			require.NoError(t, errs[i], "claimer %d of %s", i, p.Key)
			if res.Claimed {
				require.Equal(t, -1, winner, "%s: claimers %d and %d both won", p.Key, winner, i)
				winner = i
			}
		}
		require.NotEqual(t, -1, winner, "%s: no claimer won", p.Key)
		for i, res := range results {
			if i != winner {
				require.Equal(t, idemdriver.StateSucceeded, res.Record.State, "claimer %d of %s", i, p.Key)
				require.Equal(t, fmt.Sprint(winner), string(res.Record.Response.Body), "claimer %d of %s replays the winner", i, p.Key)
			}
		}
	}
	for k := range keys {
		p := idemdriver.ClaimParams{Scope: "acct", Key: fmt.Sprintf("race-tx-%d", k), Method: "POST", Path: "/v1/payments",
			Fingerprint: []byte{1}, LeaseDuration: 30 * time.Second, Retention: retention}
		race(p)
		p.Fingerprint, p.ClockOffset = []byte{2}, retention+time.Minute
		race(p)
	}
}

// atOnce runs claim(0) to claim(n-1) in n goroutines released together,
// and returns their results and errors by index.
func atOnce(n int, claim func(i int) (idemdriver.ClaimResult, error)) ([]idemdriver.ClaimResult, []error) {
	results, errs := make([]idemdriver.ClaimResult, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = claim(i)
		})
	}
	close(start)
	wg.Wait()
	return results, errs
}
