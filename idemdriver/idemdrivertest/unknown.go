package idemdrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// runUnknown holds an idemdriver.Stepper to CONTRACT section 11.3: an
// at-most-once step is never started twice, an UNKNOWN record is never
// claimed, taken over or purged, and only a compare-and-set resolution
// ends it.
func runUnknown(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"AtMostOnceNotStartedTwice", unknownAtMostOnceNotStartedTwice},
		{"NeverClaimedNorPurged", unknownNeverClaimedNorPurged},
		{"MarkFencedByToken", unknownMarkFencedByToken},
		{"ResolveApplied", unknownResolveApplied},
		{"ResolveNotApplied", unknownResolveNotApplied},
		{"ResolveComparesAndSets", unknownResolveComparesAndSets},
		{"Counted", unknownCounted},
	})
}

// CountUnknown counts the UNKNOWN records and the oldest one's last change,
// and nothing else.
func unknownCounted(t *testing.T, h Harness) {
	t.Parallel()
	sd, first := stepsOn(t, h)
	counter, ok := sd.Driver.(idemdriver.UnknownCounter)
	require.True(t, ok, "%T implements idemdriver.UnknownCounter", sd.Driver)
	ctx := context.Background()
	n, oldest, now, err := counter.CountUnknown(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, oldest.IsZero())
	require.False(t, now.IsZero())

	markUnknown(t, sd, first, "transfer")
	sd.Clock.Advance(time.Minute)
	res := claim(t, sd, params("acct", "k2", "body"))
	markUnknown(t, sd, res.Record, "transfer")
	claim(t, sd, params("acct", "k3", "body")) // PROCESSING: not counted
	n, oldest, now, err = counter.CountUnknown(ctx, sd.Clock.Offset())
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, record(t, sd, "acct", "k").UpdatedAt.UnixMicro(), oldest.UnixMicro(), "the oldest's last change")
	require.Greater(t, now.Sub(oldest), 59*time.Second)
}

func atMostOnceOf(rec idemdriver.Record, name string) idemdriver.StartStepParams {
	p := startOf(rec, name)
	p.AtMostOnce = true
	return p
}

func unknownOf(rec idemdriver.Record, name string) idemdriver.UnknownParams {
	return idemdriver.UnknownParams{StepParams: stepOf(rec, name), Reason: idemdriver.ReasonStepUncertain}
}

func resolveOf(rec idemdriver.Record, name string, applied bool) idemdriver.ResolveStepParams {
	p := idemdriver.ResolveStepParams{StepParams: stepOf(rec, name), Applied: applied,
		By: "ops@example.com", Why: "INC-7: the bank's statement", Retention: retention}
	if applied {
		p.Result = []byte(`{"v":1,"value":"tr_1"}`)
	}
	return p
}

// markUnknown starts name at-most-once under rec's token and ends rec
// UNKNOWN at it.
func markUnknown(t *testing.T, sd *ShiftedDriver, rec idemdriver.Record, name string) {
	t.Helper()
	startStep(t, sd, atMostOnceOf(rec, name))
	require.NoError(t, sd.MarkUnknown(context.Background(), unknownOf(rec, name)))
}

// A takeover finds an at-most-once start as stored, never started again,
// where an ordinary start is started again under the new token.
func unknownAtMostOnceNotStartedTwice(t *testing.T, h Harness) {
	t.Parallel()
	sd, old := stepsOn(t, h)
	s := startStep(t, sd, atMostOnceOf(old, "transfer"))
	require.True(t, s.AtMostOnce)
	require.Equal(t, old.FencingToken, s.StartedToken)
	startStep(t, sd, startOf(old, "charge"))

	sd.Clock.Advance(lease + time.Second)
	res := claim(t, sd, params("acct", "k", "body"))
	require.True(t, res.Claimed, "taken over")
	cur := res.Record

	held := startStep(t, sd, atMostOnceOf(cur, "transfer"))
	require.False(t, held.Done)
	require.True(t, held.AtMostOnce)
	require.Equal(t, old.FencingToken, held.StartedToken, "the earlier start is kept: the caller must not run it")
	ordinary := startStep(t, sd, startOf(cur, "transfer"))
	require.Equal(t, old.FencingToken, ordinary.StartedToken, "nor does an ordinary start of the same name restart it")
	again := startStep(t, sd, startOf(cur, "charge"))
	require.Equal(t, cur.FencingToken, again.StartedToken, "an ordinary step is started again")
}

// An UNKNOWN record: no lease, expires_at FarFuture, its step keeps the
// reason; no claim of any request takes it, expired or not; no purge
// removes it; the old owner's fenced writes all miss.
func unknownNeverClaimedNorPurged(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	markUnknown(t, sd, rec, "transfer")

	got := record(t, sd, rec.Scope, rec.Key)
	require.Equal(t, idemdriver.StateUnknown, got.State)
	require.Nil(t, got.LockedUntil, "no lease")
	require.LessOrEqual(t, got.LeaseLeft, time.Duration(0))
	require.Equal(t, idemdriver.FarFuture.Year(), got.ExpiresAt.UTC().Year(), "expires_at %s", got.ExpiresAt)
	require.True(t, got.CreatedAt.Equal(rec.CreatedAt), "the same life")
	list := steps(t, sd, rec)
	require.Len(t, list, 1)
	require.Equal(t, idemdriver.ReasonStepUncertain, list[0].Reason)
	require.True(t, list[0].AtMostOnce)
	require.False(t, list[0].Done)

	var at time.Duration
	for _, later := range []time.Duration{0, lease + time.Second, retention + time.Second, 10 * 365 * 24 * time.Hour} {
		sd.Clock.Advance(later - at)
		at = later
		for _, body := range []string{"body", "another body"} {
			res := claim(t, sd, params("acct", "k", body))
			require.False(t, res.Claimed, "%s later, body %q: never claimed", later, body)
			require.Equal(t, idemdriver.StateUnknown, res.Record.State)
			want := idemdriver.DecisionUnknown
			if body != "body" {
				want = idemdriver.DecisionKeyReused
			}
			require.Equal(t, want, idemdriver.Decide(&res.Record, false, params("acct", "k", body)), "%s later", later)
		}
		if purger, ok := sd.Driver.(idemdriver.Purger); ok {
			n, err := purger.PurgeExpired(context.Background(), idemdriver.PurgeParams{Limit: 10, ClockOffset: sd.Clock.Offset()})
			require.NoError(t, err)
			require.Zero(t, n, "%s later: never purged", later)
		}
		if parts, ok := sd.Driver.(idemdriver.Partitioner); ok && parts.Partitioned() {
			_, err := parts.DropPartitions(context.Background(), idemdriver.PartitionParams{ClockOffset: sd.Clock.Offset()})
			require.NoError(t, err)
			require.Equal(t, idemdriver.StateUnknown, record(t, sd, rec.Scope, rec.Key).State, "%s later: never dropped", later)
			require.Len(t, steps(t, sd, rec), 1, "%s later: its step never swept", later)
		}
	}
	f := fence(rec)
	require.False(t, wrote(t, sd.Heartbeat, f), "the old owner's lease is gone")
	require.False(t, wrote(t, sd.Fail, f))
	require.False(t, wrote(t, sd.Release, f))
	require.False(t, complete(t, sd, f, okResponse(`{}`)))
	require.Equal(t, idemdriver.StateUnknown, record(t, sd, rec.Scope, rec.Key).State)
}

// MarkUnknown is fenced: another token, or an ended execution, writes
// nothing.
func unknownMarkFencedByToken(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	startStep(t, sd, atMostOnceOf(rec, "transfer"))
	other := unknownOf(rec, "transfer")
	other.FencingToken++
	require.ErrorIs(t, sd.MarkUnknown(context.Background(), other), idemdriver.ErrFencedOut)
	require.Equal(t, idemdriver.StateProcessing, record(t, sd, rec.Scope, rec.Key).State)
	require.Empty(t, steps(t, sd, rec)[0].Reason, "nothing written")

	require.True(t, wrote(t, sd.Fail, fence(rec)))
	require.ErrorIs(t, sd.MarkUnknown(context.Background(), unknownOf(rec, "transfer")), idemdriver.ErrFencedOut)
	require.Equal(t, idemdriver.StateFailed, record(t, sd, rec.Scope, rec.Key).State)
}

// Resolved applied: the step holds the given result and who, when and why;
// the record is FAILED in the same life, expiring after the retention, and
// its next claim finds the step done.
func unknownResolveApplied(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	markUnknown(t, sd, rec, "transfer")
	require.NoError(t, sd.ResolveStep(context.Background(), resolveOf(rec, "transfer", true)))

	got := record(t, sd, rec.Scope, rec.Key)
	require.Equal(t, idemdriver.StateFailed, got.State)
	require.Zero(t, got.Attempts, "attempts count from the resolution (a completer's MaxAttempts)")
	require.True(t, got.CreatedAt.Equal(rec.CreatedAt), "the same life")
	require.Less(t, got.ExpiresAt.Year(), 9999, "expires_at %s", got.ExpiresAt)
	s := steps(t, sd, rec)[0]
	require.True(t, s.Done)
	require.Equal(t, `{"v":1,"value":"tr_1"}`, string(s.Result))
	require.Equal(t, "ops@example.com", s.ResolvedBy)
	require.Equal(t, "INC-7: the bank's statement", s.ResolvedWhy)
	require.False(t, s.ResolvedAt.IsZero())
	require.False(t, s.FinishedAt.IsZero())

	res := claim(t, sd, params("acct", "k", "body"))
	require.True(t, res.Claimed, "the next request resumes it")
	require.True(t, res.Record.CreatedAt.Equal(rec.CreatedAt), "in the same life")
	again := startStep(t, sd, atMostOnceOf(res.Record, "transfer"))
	require.True(t, again.Done, "the resolved result, not a run")

	sd.Clock.Advance(retention + time.Second)
	require.True(t, complete(t, sd, fence(res.Record), okResponse(`{}`)))
	purger, ok := sd.Driver.(idemdriver.Purger)
	if ok {
		n, err := purger.PurgeExpired(context.Background(), idemdriver.PurgeParams{Limit: 10, ClockOffset: sd.Clock.Offset() + retention + time.Second})
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "a resolved record is purged as any other")
	}
}

// Resolved not applied: the start is cleared (token 0), the record FAILED;
// the next execution starts the step again under its own token.
func unknownResolveNotApplied(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	markUnknown(t, sd, rec, "transfer")
	require.NoError(t, sd.ResolveStep(context.Background(), resolveOf(rec, "transfer", false)))

	require.Equal(t, idemdriver.StateFailed, record(t, sd, rec.Scope, rec.Key).State)
	s := steps(t, sd, rec)[0]
	require.False(t, s.Done)
	require.Zero(t, s.StartedToken, "the start is cleared")
	require.Equal(t, "ops@example.com", s.ResolvedBy)

	res := claim(t, sd, params("acct", "k", "body"))
	require.True(t, res.Claimed)
	again := startStep(t, sd, atMostOnceOf(res.Record, "transfer"))
	require.False(t, again.Done)
	require.Equal(t, res.Record.FencingToken, again.StartedToken, "started again by the next execution")
}

// ResolveStep is a compare-and-set: another token, another life, a record
// that is not UNKNOWN or a step that does not exist changes nothing.
func unknownResolveComparesAndSets(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	ctx := context.Background()
	startStep(t, sd, atMostOnceOf(rec, "transfer"))
	require.ErrorIs(t, sd.ResolveStep(ctx, resolveOf(rec, "transfer", true)), idemdriver.ErrNotFound, "not UNKNOWN yet")
	require.NoError(t, sd.MarkUnknown(ctx, unknownOf(rec, "transfer")))

	token := resolveOf(rec, "transfer", true)
	token.FencingToken++
	life := resolveOf(rec, "transfer", true)
	life.CreatedAt = life.CreatedAt.Add(time.Microsecond)
	for what, p := range map[string]idemdriver.ResolveStepParams{
		"another token": token, "another life": life, "another step": resolveOf(rec, "refund", true),
	} {
		require.ErrorIs(t, sd.ResolveStep(ctx, p), idemdriver.ErrNotFound, what)
		require.Equal(t, idemdriver.StateUnknown, record(t, sd, rec.Scope, rec.Key).State, "%s: nothing written", what)
		require.False(t, steps(t, sd, rec)[0].Done, what)
	}
	require.NoError(t, sd.ResolveStep(ctx, resolveOf(rec, "transfer", false)))
	require.ErrorIs(t, sd.ResolveStep(ctx, resolveOf(rec, "transfer", true)), idemdriver.ErrNotFound, "resolved once")
}
