package idemdrivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// runSteps holds an idemdriver.Stepper to CONTRACT section 11.1: a start
// marker written only under the owning token, a result kept by its first
// writer, a record life's steps apart from another life's and gone with
// their record.
func runSteps(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"EngineRunsEachStepOnce", stepsEngineRunsEachStepOnce},
		{"StartThenFinish", stepsStartThenFinish},
		{"FirstResultWins", stepsFirstResultWins},
		{"FencedByToken", stepsFencedByToken},
		{"Clear", stepsClear},
		{"LivesApart", stepsLivesApart},
		{"GoWithTheRecord", stepsGoWithTheRecord},
		{"GoWithAPurge", stepsGoWithAPurge},
	})
	if h.Partitioned {
		runCases(t, h, []suiteCase{{"GoWithADroppedPartition", stepsGoWithADroppedPartition}})
	}
}

// stepsOn returns a shifted driver whose store implements
// idemdriver.Stepper and a claimed record of a fresh key on it.
func stepsOn(t *testing.T, h Harness) (*ShiftedDriver, idemdriver.Record) {
	t.Helper()
	d := h.NewDriver(t)
	_, ok := d.(idemdriver.Stepper)
	require.True(t, ok, "%T implements idemdriver.Stepper", d)
	return setup(t, d, "PROCESSING", params("acct", "k", "body"))
}

// Through the engine: duplicates at once and retries after failures, on
// several keys; each key's step runs once, and every success answers the
// one recorded result.
func stepsEngineRunsEachStepOnce(t *testing.T, h Harness) {
	t.Parallel()
	opts := idem.EngineOptions{}
	opts.Waiting.Wait = time.Minute // a duplicate waits for the owner's end, which is bounded
	g, _ := newEngine(t, h, false, opts)
	const keys, callers, failures = 4, 6, 2
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		var charges, after atomic.Int32
		fn := func(ctx context.Context) (idem.Result, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
				return fmt.Sprintf("ch_%d", charges.Add(1)), nil
			})
			if err != nil {
				return idem.Result{}, err
			}
			if after.Add(1) <= failures {
				return idem.Result{}, errors.New("the ledger write failed after the charge")
			}
			return idem.Result{Status: 201, Body: []byte(id)}, nil
		}
		var wg sync.WaitGroup
		bodies := make(chan string, callers*(failures+2))
		for range callers {
			wg.Go(func() {
				for try := 0; try < failures+2; try++ { // at most the failures, then the outcome
					out, err := g.Do(context.Background(), idem.DoParams{Scope: "s", Key: key}, fn)
					if err == nil {
						bodies <- string(out.Body)
						return
					}
				}
			})
		}
		wg.Wait()
		close(bodies)
		require.EqualValues(t, 1, charges.Load(), "key %s: the step ran once", key)
		n := 0
		for b := range bodies {
			require.Equal(t, "ch_1", b, "key %s", key)
			n++
		}
		require.Equal(t, callers, n, "key %s: every caller got the outcome", key)
	}
}

func stepOf(rec idemdriver.Record, name string) idemdriver.StepParams {
	return idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: name}
}

func startOf(rec idemdriver.Record, name string) idemdriver.StartStepParams {
	return idemdriver.StartStepParams{StepParams: stepOf(rec, name), Relay: []byte("idr1_" + name)}
}

func finishOf(rec idemdriver.Record, name, result string) idemdriver.FinishStepParams {
	return idemdriver.FinishStepParams{StepParams: stepOf(rec, name), Result: []byte(result)}
}

func startStep(t *testing.T, sd *ShiftedDriver, p idemdriver.StartStepParams) idemdriver.Step {
	t.Helper()
	s, err := sd.StartStep(context.Background(), p)
	require.NoError(t, err, "start step %s", p.Name)
	return s
}

func finishStep(t *testing.T, sd *ShiftedDriver, p idemdriver.FinishStepParams) idemdriver.Step {
	t.Helper()
	s, err := sd.FinishStep(context.Background(), p)
	require.NoError(t, err, "finish step %s", p.Name)
	return s
}

func steps(t *testing.T, sd *ShiftedDriver, rec idemdriver.Record) []idemdriver.Step {
	t.Helper()
	got, err := sd.Steps(context.Background(), stepOf(rec, ""))
	require.NoError(t, err)
	return got
}

// A start marker, then its result: both as stored, and a start of a
// finished step gives its result back without starting it again.
func stepsStartThenFinish(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	s := startStep(t, sd, startOf(rec, "charge"))
	require.Equal(t, "charge", s.Name)
	require.False(t, s.Done)
	require.Equal(t, rec.FencingToken, s.StartedToken)
	require.Equal(t, []byte("idr1_charge"), s.Relay)
	require.False(t, s.StartedAt.IsZero())
	require.Empty(t, s.Result)

	done := finishStep(t, sd, finishOf(rec, "charge", `{"v":1}`))
	require.True(t, done.Done)
	require.Equal(t, []byte(`{"v":1}`), done.Result)
	require.False(t, done.FinishedAt.Before(done.StartedAt), "finished %s, started %s", done.FinishedAt, done.StartedAt)

	again := startStep(t, sd, startOf(rec, "charge"))
	require.True(t, again.Done, "a finished step is not started again")
	require.Equal(t, []byte(`{"v":1}`), again.Result)

	startStep(t, sd, startOf(rec, "email"))
	list := steps(t, sd, rec)
	require.Len(t, list, 2)
	require.Equal(t, "charge", list[0].Name)
	require.True(t, list[0].Done)
	require.Equal(t, "email", list[1].Name)
	require.False(t, list[1].Done)

	_, err := sd.FinishStep(context.Background(), finishOf(rec, "never-started", "x"))
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "no result without a start marker")
}

// Results written at once by many writers: one is kept, and every writer
// is answered with it.
func stepsFirstResultWins(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	startStep(t, sd, startOf(rec, "charge"))
	const writers = 8
	got := make([]string, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			s, err := sd.FinishStep(context.Background(), finishOf(rec, "charge", fmt.Sprintf("result %d", i)))
			if err == nil {
				got[i] = string(s.Result)
			}
		})
	}
	wg.Wait()
	stored := steps(t, sd, rec)[0]
	for i, g := range got {
		require.Equal(t, string(stored.Result), g, "writer %d is answered the kept result", i)
	}
}

// Only the owning token starts a step; a takeover starts an unfinished
// step again under its own token; a result is kept from whichever owner
// got it, fenced out or not; an ended execution starts nothing.
func stepsFencedByToken(t *testing.T, h Harness) {
	t.Parallel()
	sd, old := stepsOn(t, h)
	startStep(t, sd, startOf(old, "charge"))
	sd.Clock.Advance(lease + time.Second)
	res := claim(t, sd, params("acct", "k", "body"))
	require.True(t, res.Claimed, "taken over")
	cur := res.Record
	require.Greater(t, cur.FencingToken, old.FencingToken)

	_, err := sd.StartStep(context.Background(), startOf(old, "refund"))
	require.ErrorIs(t, err, idemdriver.ErrFencedOut, "the old owner starts no step")
	_, err = sd.StartStep(context.Background(), startOf(old, "charge"))
	require.ErrorIs(t, err, idemdriver.ErrFencedOut, "nor starts one again")
	require.Len(t, steps(t, sd, cur), 1, "the refused starts wrote nothing")

	s := startStep(t, sd, startOf(cur, "charge"))
	require.False(t, s.Done)
	require.Equal(t, cur.FencingToken, s.StartedToken, "started again by the new owner")

	done := finishStep(t, sd, finishOf(old, "charge", "from the old owner"))
	require.Equal(t, "from the old owner", string(done.Result), "a fenced-out owner's known result is kept")
	again := startStep(t, sd, startOf(cur, "charge"))
	require.True(t, again.Done)
	require.Equal(t, "from the old owner", string(again.Result))

	require.True(t, complete(t, sd, fence(cur), okResponse(`{}`)))
	_, err = sd.StartStep(context.Background(), startOf(cur, "email"))
	require.ErrorIs(t, err, idemdriver.ErrFencedOut, "an ended execution starts no step")
	ended := startStep(t, sd, startOf(cur, "charge"))
	require.True(t, ended.Done, "its finished steps still read")
}

// A start without a result is cleared by its owner only; a result is never
// cleared.
func stepsClear(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	startStep(t, sd, startOf(rec, "charge"))
	startStep(t, sd, startOf(rec, "email"))
	finishStep(t, sd, finishOf(rec, "email", "sent"))
	ctx := context.Background()

	other := stepOf(rec, "charge")
	other.FencingToken++
	ok, err := sd.ClearStep(ctx, other)
	require.NoError(t, err)
	require.False(t, ok, "another token clears nothing")
	ok, err = sd.ClearStep(ctx, stepOf(rec, "email"))
	require.NoError(t, err)
	require.False(t, ok, "a result is never cleared")
	ok, err = sd.ClearStep(ctx, stepOf(rec, "charge"))
	require.NoError(t, err)
	require.True(t, ok)
	list := steps(t, sd, rec)
	require.Len(t, list, 1)
	require.Equal(t, "email", list[0].Name)
}

// A new life of the key sees none of the earlier life's steps.
func stepsLivesApart(t *testing.T, h Harness) {
	t.Parallel()
	sd, first := stepsOn(t, h)
	startStep(t, sd, startOf(first, "charge"))
	finishStep(t, sd, finishOf(first, "charge", "first life"))
	require.True(t, complete(t, sd, fence(first), okResponse(`{}`)))
	sd.Clock.Advance(retention + time.Second)
	res := claim(t, sd, params("acct", "k", "another body"))
	require.True(t, res.Claimed)
	second := res.Record
	require.False(t, second.CreatedAt.Equal(first.CreatedAt), "a new life")
	require.Empty(t, steps(t, sd, second))
	s := startStep(t, sd, startOf(second, "charge"))
	require.False(t, s.Done, "the new life's step starts afresh")
}

// A record's steps go when the record goes: a release.
func stepsGoWithTheRecord(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	startStep(t, sd, startOf(rec, "charge"))
	finishStep(t, sd, finishOf(rec, "charge", "x"))
	ok, err := sd.Release(context.Background(), fence(rec))
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, steps(t, sd, rec), "released with the record")
}

// A record's steps go when the record goes: a purge (idemdriver.Purger).
func stepsGoWithAPurge(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	purger := need[idemdriver.Purger](t, sd.Driver, h.Maintenance)
	startStep(t, sd, startOf(rec, "charge"))
	finishStep(t, sd, finishOf(rec, "charge", "x"))
	require.True(t, complete(t, sd, fence(rec), okResponse(`{}`)))
	n, err := purger.PurgeExpired(context.Background(), idemdriver.PurgeParams{Limit: 10, ClockOffset: retention + time.Second})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Empty(t, steps(t, sd, rec), "purged with the record")
}

// On a partitioned store, where no foreign key ties steps to records: the
// steps of a record dropped with its partition are swept by the drop, once
// their life started more than the partitions ahead ago; an UNKNOWN
// record, in the far-future partition, is not dropped and keeps its step.
func stepsGoWithADroppedPartition(t *testing.T, h Harness) {
	t.Parallel()
	sd, rec := stepsOn(t, h)
	ctx := context.Background()
	parts := need[idemdriver.Partitioner](t, sd.Driver, true)
	ahead := need[idemdriver.RetentionLimiter](t, sd.Driver, true).MaxRetention() + 24*time.Hour // DaysAhead
	startStep(t, sd, startOf(rec, "charge"))
	finishStep(t, sd, finishOf(rec, "charge", "x"))
	require.True(t, complete(t, sd, fence(rec), okResponse(`{}`)))
	held := claim(t, sd, params("acct", "held", "body")).Record
	markUnknown(t, sd, held, "transfer")

	sd.Clock.Advance(ahead - time.Hour)
	dropped, err := parts.DropPartitions(ctx, idemdriver.PartitionParams{ClockOffset: sd.Clock.Offset()})
	require.NoError(t, err)
	require.NotEmpty(t, dropped, "the completed record's partition")
	requireGone(t, sd, rec.Scope, rec.Key)
	require.Len(t, steps(t, sd, rec), 1, "kept until its life started the partitions ahead ago")

	sd.Clock.Advance(2 * time.Hour)
	_, err = parts.DropPartitions(ctx, idemdriver.PartitionParams{ClockOffset: sd.Clock.Offset()})
	require.NoError(t, err)
	require.Empty(t, steps(t, sd, rec), "swept")
	require.Equal(t, idemdriver.StateUnknown, record(t, sd, held.Scope, held.Key).State, "never dropped")
	require.Len(t, steps(t, sd, held), 1, "kept with its record")
}
