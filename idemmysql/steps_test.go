package idemmysql_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
)

// StartStep's ON DUPLICATE KEY UPDATE assigns started_at, started_token and
// at_most_once from the stored row whether the server evaluates the
// assignments left to right, each seeing the ones before it (MySQL,
// MariaDB's default), or all on the row as it was (MariaDB's sql_mode
// SIMULTANEOUS_ASSIGNMENT, which applies to ON DUPLICATE KEY UPDATE too):
// every change of at_most_once and each held start, in both.
func TestStartStepAssignments(t *testing.T) {
	t.Parallel()
	modes := map[string]string{
		"left to right": "",
		"simultaneous":  "sql_mode=%27STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT%27",
	}
	for name, params := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := openUnmigrated(t, params)
			if params != "" {
				var mode string
				require.NoError(t, d.DB().QueryRowContext(ctx, `SELECT @@SESSION.sql_mode`).Scan(&mode))
				if !slices.Contains(strings.Split(mode, ","), "SIMULTANEOUS_ASSIGNMENT") {
					t.Skipf("the server has no SIMULTANEOUS_ASSIGNMENT (sql_mode %s)", mode)
				}
			}
			require.NoError(t, d.Migrate(ctx))
			startAssignments(t, d)
		})
	}
}

func startAssignments(t *testing.T, d *idemmysql.Driver) {
	ctx := context.Background()
	var offset time.Duration
	claim := func() idemdriver.Record {
		t.Helper()
		p := params("acct", "k", "b")
		p.ClockOffset = offset
		res, err := d.Claim(ctx, p)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		return res.Record
	}
	step := func(rec idemdriver.Record, name string) idemdriver.StepParams {
		return idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken,
			Name: name, ClockOffset: offset}
	}
	start := func(rec idemdriver.Record, name string, amo bool) idemdriver.Step {
		t.Helper()
		s, err := d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step(rec, name), Relay: []byte("r"), AtMostOnce: amo})
		require.NoError(t, err)
		require.False(t, s.Done)
		return s
	}

	first := claim()
	start(first, "ordinary", false)
	start(first, "held", true)
	s := start(first, "again", true)
	require.Equal(t, s, start(first, "again", true), "the same start again: held, as stored")
	require.Equal(t, s, start(first, "again", false), "an ordinary start of it too")

	offset = lease + time.Second
	second := claim()
	require.Equal(t, first.FencingToken+1, second.FencingToken, "taken over")
	s = start(second, "ordinary", true)
	require.Equal(t, second.FencingToken, s.StartedToken, "an ordinary start is started again")
	require.True(t, s.AtMostOnce, "at-most-once now")
	s = start(second, "held", false)
	require.Equal(t, first.FencingToken, s.StartedToken, "held")
	require.True(t, s.AtMostOnce, "and still at-most-once")

	require.NoError(t, d.MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: step(second, "held"), Reason: idemdriver.ReasonStepUnrecorded}))
	require.NoError(t, d.ResolveStep(ctx, idemdriver.ResolveStepParams{StepParams: step(second, "held"), By: "ops", Why: "not sent", Retention: retention}))
	third := claim()
	require.Equal(t, second.CreatedAt, third.CreatedAt, "the same life")
	s = start(third, "held", false)
	require.Equal(t, third.FencingToken, s.StartedToken, "a cleared start is started again")
	require.False(t, s.AtMostOnce, "as the new start says")
	s = start(third, "ordinary", false)
	require.Equal(t, second.FencingToken, s.StartedToken, "the at-most-once start of the second execution is held")
	require.True(t, s.AtMostOnce)
}
