package idempgx_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
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

// The claim reads first (issue 21): the answer to an existing key that may
// not be claimed (a replay, 409, 422) is one plain SELECT, with no INSERT
// in it, which PostgreSQL answers at about twice the rate of a statement
// holding one; a new key is the read and a plain INSERT; a key that may be
// claimed again (FAILED here) is the read and the deciding claim statement.
func TestClaimReadsFirst(t *testing.T) {
	t.Parallel()
	tracer := &sqlTracer{}
	d := openDriver(t, false, tracer)
	ctx := context.Background()
	p := idemdriver.ClaimParams{Scope: "acct", Key: "shape", Method: "POST", Path: "/v1/payments", Fingerprint: []byte{1},
		LeaseDuration: 30 * time.Second, Retention: time.Hour}
	other := p
	other.Fingerprint = []byte{2}
	claim := func(p idemdriver.ClaimParams, want idemdriver.Decision, statements ...string) idemdriver.ClaimResult {
		t.Helper()
		tracer.take()
		res, err := d.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, want.Claims(), res.Claimed, want.String())
		require.Equal(t, statements, tracer.take(), want.String())
		return res
	}

	first := claim(p, idemdriver.DecisionNew, "select", "insert")
	require.EqualValues(t, 1, first.Record.FencingToken)
	require.EqualValues(t, 1, first.Record.Attempts)
	require.Equal(t, idemdriver.StateProcessing, first.Record.State)
	require.Positive(t, first.Record.LeaseLeft)
	// The record the INSERT returns (what the database decided, the rest
	// from the claim) is the record as stored.
	stored, err := d.Get(ctx, idemdriver.GetParams{Scope: p.Scope, Key: p.Key})
	require.NoError(t, err)
	require.InDelta(t, stored.LeaseLeft, first.Record.LeaseLeft, float64(time.Second))
	stored.LeaseLeft = first.Record.LeaseLeft
	require.Equal(t, stored, first.Record)
	claim(p, idemdriver.DecisionInFlight, "select")
	claim(other, idemdriver.DecisionKeyReused, "select")

	fence := idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: 1, CreatedAt: first.Record.CreatedAt}
	ok, err := d.Fail(ctx, fence)
	require.NoError(t, err)
	require.True(t, ok)
	again := claim(p, idemdriver.DecisionReclaim, "select", "claim")
	require.EqualValues(t, 2, again.Record.FencingToken)
	require.EqualValues(t, 2, again.Record.Attempts)
	require.True(t, again.Record.CreatedAt.Equal(first.Record.CreatedAt), "a re-claim continues the record's life")

	fence.FencingToken = 2
	ok, err = d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence,
		Response: idemdriver.Response{Status: 201, Body: []byte(`{}`), BodyStored: true, BodySize: 2}})
	require.NoError(t, err)
	require.True(t, ok)
	replay := claim(p, idemdriver.DecisionReplay, "select")
	require.Equal(t, idemdriver.StateSucceeded, replay.Record.State)
	require.Equal(t, 201, replay.Record.Response.Status)
	require.Equal(t, `{}`, string(replay.Record.Response.Body))
	require.Equal(t, p.Scope, replay.Record.Scope)
	require.Equal(t, p.Key, replay.Record.Key)
	claim(other, idemdriver.DecisionKeyReused, "select")
}
