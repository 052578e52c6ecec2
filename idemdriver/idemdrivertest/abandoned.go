package idemdrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// runAbandoned holds an idemdriver.AbandonedLister to CONTRACT section
// 11.4: it lists the abandoned executions (PROCESSING past the lease, or
// FAILED) untouched for the grace and past a started step, and nothing
// else: not a live lease, not one without a step (or with idem's internal
// steps only), not SUCCEEDED, not UNKNOWN.
func runAbandoned(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"PastAStepOnly", abandonedPastAStepOnly},
		{"GraceAndLimit", abandonedGraceAndLimit},
	})
}

// abandonedOn claims key on sd, starts the steps named (none: no step),
// and ends it as end says: "live", "dead" (its lease runs out with the
// clock), "failed", "succeeded", "unknown", "not-applied" (UNKNOWN, then
// resolved not applied).
func abandonedOn(t *testing.T, sd *ShiftedDriver, key, end string, steps ...string) idemdriver.Record {
	t.Helper()
	res := claim(t, sd, params("acct", key, "body"))
	require.True(t, res.Claimed)
	rec := res.Record
	for _, name := range steps {
		startStep(t, sd, atMostOnceOf(rec, name))
	}
	switch end {
	case "failed":
		require.True(t, wrote(t, sd.Fail, fence(rec)))
	case "succeeded":
		require.True(t, complete(t, sd, fence(rec), okResponse(`{}`)))
	case "unknown":
		require.NoError(t, sd.MarkUnknown(context.Background(), unknownOf(rec, steps[0])))
	case "not-applied": // resolved so by an operator: FAILED, its start cleared
		require.NoError(t, sd.MarkUnknown(context.Background(), unknownOf(rec, steps[0])))
		require.NoError(t, sd.ResolveStep(context.Background(), resolveOf(rec, steps[0], false)))
	}
	return rec
}

func abandoned(t *testing.T, sd *ShiftedDriver, grace time.Duration, limit int) []string {
	t.Helper()
	lister := sd.Driver.(idemdriver.AbandonedLister)
	recs, now, err := lister.Abandoned(context.Background(), idemdriver.AbandonedParams{Grace: grace, Limit: limit, ClockOffset: sd.Clock.Offset()})
	require.NoError(t, err)
	var keys []string
	for _, r := range recs {
		require.False(t, now.IsZero(), "the database's now")
		require.False(t, r.UpdatedAt.After(now.Add(-grace)), "%s updated %s, now %s", r.Key, r.UpdatedAt, now)
		keys = append(keys, r.Key)
	}
	return keys
}

func abandonedPastAStepOnly(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	_, ok := d.(idemdriver.AbandonedLister)
	require.True(t, ok, "%T implements idemdriver.AbandonedLister", d)
	sd := Shift(d, &Clock{})
	abandonedOn(t, sd, "dead", "dead", "charge")
	abandonedOn(t, sd, "failed", "failed", "charge", "email")
	abandonedOn(t, sd, "dead-no-step", "dead")
	abandonedOn(t, sd, "failed-internal", "failed", idemdriver.KeptRequestStep)
	abandonedOn(t, sd, "succeeded", "succeeded", "charge")
	abandonedOn(t, sd, "unknown", "unknown", "charge")
	abandonedOn(t, sd, "not-applied", "not-applied", "charge") // a cleared start is no started step
	sd.Clock.Advance(lease + time.Second)
	abandonedOn(t, sd, "live", "live", "charge")
	require.ElementsMatch(t, []string{"dead", "failed"}, abandoned(t, sd, 0, 10))
}

// Only records untouched for the grace are listed, least recently updated
// first, at most the limit.
func abandonedGraceAndLimit(t *testing.T, h Harness) {
	t.Parallel()
	sd := Shift(h.NewDriver(t), &Clock{})
	abandonedOn(t, sd, "first", "failed", "charge")
	sd.Clock.Advance(10 * time.Second)
	abandonedOn(t, sd, "second", "failed", "charge")
	sd.Clock.Advance(10 * time.Second)
	abandonedOn(t, sd, "third", "failed", "charge")
	require.Equal(t, []string{"first", "second", "third"}, abandoned(t, sd, 0, 10))
	require.Equal(t, []string{"first", "second"}, abandoned(t, sd, 0, 2))
	require.Equal(t, []string{"first", "second"}, abandoned(t, sd, 5*time.Second, 10))
	require.Equal(t, []string{"first"}, abandoned(t, sd, 15*time.Second, 10))
	require.Empty(t, abandoned(t, sd, time.Hour, 10))
}
