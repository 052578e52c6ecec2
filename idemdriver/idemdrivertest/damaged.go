package idemdrivertest

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// The cases of a record that cannot be a valid one: PROCESSING without a
// lease bound (locked_until NULL, written by hand or by a partial restore;
// no claim or heartbeat writes one). Nothing can tell whether its
// execution still runs, so no claim takes it (idemdriver.DecisionDamaged),
// the core answers 500 record-damaged and never runs the request, and
// Inspector.Stuck lists it for an operator.

// damage claims p on d and empties its record's lease bound with
// Harness.Tamper; it returns the record as claimed.
func damage(t *testing.T, h Harness, d idemdriver.Driver, p idemdriver.ClaimParams) idemdriver.Record {
	t.Helper()
	require.NotNil(t, h.Tamper, "Harness.Tamper is required")
	res := claim(t, d, p)
	require.True(t, res.Claimed)
	h.Tamper(t, d, p.Scope, p.Key, map[string]any{"locked_until": nil})
	return res.Record
}

// No claim takes a damaged record: not the same request, not another, not
// past its lease, not past its retention, not the one-commit claim. Each
// answers the record as stored, which Decide names DecisionDamaged. Stats
// counts it and Stuck lists it first, with no overdue time.
func driverDamagedProcessing(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	clock := &Clock{}
	sd := Shift(d, clock)
	p := params("acct", "damaged", "body")
	before := damage(t, h, d, p)
	other := p
	other.Fingerprint = fingerprint("another body")
	stale := params("acct", "stale", "body")
	require.True(t, claim(t, sd, stale).Claimed)

	for _, step := range []time.Duration{0, lease + time.Second, retention} {
		clock.Advance(step)
		for _, q := range []idemdriver.ClaimParams{p, other} {
			rec := record(t, sd, "acct", "damaged")
			require.Nil(t, rec.LockedUntil, "Get reads the NULL lease bound")
			require.True(t, rec.Damaged())
			require.Equal(t, idemdriver.DecisionDamaged, idemdriver.Decide(&rec, step >= retention, q), "Decide names the row")
			res := claim(t, sd, q)
			require.False(t, res.Claimed, "+%s: a damaged record is never claimed", clock.Offset())
			require.Equal(t, before.FencingToken, res.Record.FencingToken, "the record it lost to, untouched")
			require.Equal(t, idemdriver.StateProcessing, res.Record.State)
			require.Nil(t, res.Record.LockedUntil, "the claim's read")
			require.Zero(t, res.Record.LeaseLeft)
			if tc, ok := d.(idemdriver.TxClaimer); ok {
				q.ClockOffset = clock.Offset()
				res, tx, err := tc.ClaimTx(context.Background(), q, 5*time.Second)
				require.NoError(t, err)
				require.Nil(t, tx, "no transaction is held for a record not claimed")
				require.False(t, res.Claimed, "the one-commit claim")
				require.Equal(t, before.FencingToken, res.Record.FencingToken)
			}
		}
	}

	in, ok := d.(idemdriver.Inspector)
	if !ok {
		require.False(t, h.Maintenance, "the harness declares Maintenance, but %T is no Inspector", d)
		return
	}
	st, err := in.Stats(context.Background(), idemdriver.StatsParams{ClockOffset: clock.Offset()})
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Damaged)
	require.EqualValues(t, 1, st.Stuck, "the record past its lease; the damaged one is counted apart")
	stuck, err := in.Stuck(context.Background(), idemdriver.StuckParams{Limit: 10, ClockOffset: clock.Offset()})
	require.NoError(t, err)
	require.Len(t, stuck, 2)
	require.Equal(t, "damaged", stuck[0].Key, "the damaged record first")
	require.True(t, stuck[0].Damaged())
	require.Zero(t, stuck[0].Overdue)
	require.Equal(t, "stale", stuck[1].Key)
	require.Positive(t, stuck[1].Overdue)
	stuck, err = in.Stuck(context.Background(), idemdriver.StuckParams{Limit: 1})
	require.NoError(t, err)
	require.Len(t, stuck, 1, "listed before any lease ran out")
	require.Equal(t, "damaged", stuck[0].Key)
}

// Do on a damaged record answers ErrRecordDamaged and never runs fn, for
// the same payload or another, with a wait too (a damaged record is no
// execution in flight to wait for); the record stays as it was.
func engineDamagedNeverRuns(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Waiting: idem.WaitOptions{Max: 10 * time.Second, Wait: 10 * time.Second}})
	p := idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "DO", Path: "orders", Fingerprint: fingerprint("x"),
		LeaseDuration: lease, Retention: retention}
	before := damage(t, h, d, p)
	var runs atomic.Int32
	for _, payload := range []string{"x", "x", "another payload"} {
		start := time.Now()
		out, err := g.Do(t.Context(), doParams("k", payload), counted(&runs, "ran"))
		require.ErrorIs(t, err, idem.ErrRecordDamaged, payload)
		require.Empty(t, out.Body)
		require.Less(t, time.Since(start), 10*time.Second, "answered, not waited out")
	}
	require.Zero(t, runs.Load(), "fn never ran")
	rec := record(t, d, "acct", "k")
	require.Equal(t, before.FencingToken, rec.FencingToken)
	require.True(t, rec.Damaged())
}

// Over HTTP a damaged record is answered 500 record-damaged, as problem
// details, without Retry-After (it is no outage), and the handler never
// runs; a request that asks to wait is answered the same.
func middlewareDamagedRecord(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	s := newServer(t, d, idem.Options{Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Max: 10 * time.Second}, Logger: slog.New(slog.DiscardHandler)}}, &app{})
	first := s.post(t, "k", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	rec := record(t, d, "global", "k")
	h.Tamper(t, d, rec.Scope, rec.Key, map[string]any{"state": "PROCESSING", "locked_until": nil})
	for _, prefer := range []string{"", "wait=5"} {
		a := s.post(t, "k", `{"amount":1}`, func(r *http.Request) {
			if prefer != "" {
				r.Header.Set("Prefer", prefer)
			}
		})
		requireProblem(t, a, http.StatusInternalServerError, "record-damaged")
		require.Empty(t, a.header.Get("Retry-After"), "no outage to wait out")
		require.Empty(t, a.header.Get(idem.HeaderReplayed))
	}
	requireProblem(t, s.post(t, "k", `{"amount":2}`), http.StatusInternalServerError, "record-damaged")
	require.EqualValues(t, 1, s.app.runs.Load(), "the handler ran for the first request only")
}
