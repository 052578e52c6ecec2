package idemdrivertest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// runOneCommit holds a driver that implements idemdriver.TxClaimer to the
// one-commit mode (idem.Options.Engine.OneCommit.Enabled): claim, business writes and
// completion commit together, a duplicate waits on the key's row lock and
// then gets the replay (or 409 past the wait bound), and a rollback leaves
// nothing behind. Drivers without TxClaimer skip it.
func runOneCommit(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"InvisibleUntilCommit", oneCommitInvisibleUntilCommit},
		{"RollbackLeavesNothing", oneCommitRollbackLeavesNothing},
		{"RollbackRestoresFailed", oneCommitRollbackRestoresFailed},
		{"LiveLeaseIsInFlight", oneCommitLiveLeaseIsInFlight},
		{"DuplicateWaitsThenReplays", oneCommitDuplicateWaitsThenReplays},
		{"DuplicateClaimsAfterRollback", oneCommitDuplicateClaimsAfterRollback},
		{"WaitBoundGivesLockWait", oneCommitWaitBound(false)},
		{"WaitBoundOnTakeover", oneCommitWaitBound(true)},
		{"RaceOneBusinessRow", oneCommitRaceOneBusinessRow},
		{"DistinctKeysAllRun", oneCommitDistinctKeysAllRun},
		{"FailureAndPanicLeaveNothing", oneCommitFailureAndPanicLeaveNothing},
		{"ReleaseFreesTheKey", oneCommitReleaseFreesTheKey},
		{"StatementBudget", oneCommitStatementBudget},
		{"ConfigNeedsTxClaimer", oneCommitConfigNeedsTxClaimer},
	})
}

// txClaimer returns a fresh driver of h and the driver as a TxClaimer, and
// skips t when it is not one.
func txClaimer(t *testing.T, h Harness) (idemdriver.Driver, idemdriver.TxClaimer) {
	t.Helper()
	d := h.NewDriver(t)
	tc, ok := d.(idemdriver.TxClaimer)
	if !ok {
		t.Skipf("%T does not implement idemdriver.TxClaimer", d)
	}
	return d, tc
}

// claimTx claims p with ClaimTx, waiting up to wait.
func claimTx(t *testing.T, tc idemdriver.TxClaimer, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx) {
	t.Helper()
	res, tx, err := tc.ClaimTx(context.Background(), p, wait)
	require.NoError(t, err)
	require.Equal(t, res.Claimed, tx != nil, "a transaction comes back exactly when the claim is won")
	return res, tx
}

// ownTx claims "k" with ClaimTx, waiting up to 5 s, and checks that the
// claim won; msgAndArgs describe a failure.
func ownTx(t *testing.T, tc idemdriver.TxClaimer, msgAndArgs ...any) (idemdriver.ClaimResult, idemdriver.Tx) {
	t.Helper()
	res, tx := claimTx(t, tc, params("acct", "k", "body"), 5*time.Second)
	require.True(t, res.Claimed, msgAndArgs...)
	return res, tx
}

// requireLost claims p with ClaimTx and checks that the claim lost, with
// no transaction left open, answered as want from the record it lost to.
func requireLost(t *testing.T, tc idemdriver.TxClaimer, p idemdriver.ClaimParams, want idemdriver.Decision) {
	t.Helper()
	res, tx := claimTx(t, tc, p, time.Second)
	require.False(t, res.Claimed)
	require.Nil(t, tx)
	require.Equal(t, want, idemdriver.Decide(&res.Record, false, p))
}

// completeAndCommit completes rec with body in tx and commits tx.
func completeAndCommit(t *testing.T, tx idemdriver.Tx, rec idemdriver.Record, body string) {
	t.Helper()
	require.True(t, complete(t, tx, fence(rec), okResponse(body)))
	require.NoError(t, tx.Commit(context.Background()))
}

func oneCommitInvisibleUntilCommit(t *testing.T, h Harness) {
	t.Parallel()
	d, tc := txClaimer(t, h)
	res, tx := ownTx(t, tc)
	require.Equal(t, idemdriver.StateProcessing, res.Record.State)
	require.EqualValues(t, 1, res.Record.Attempts)
	if !h.SingleWriter { // SQLite's readers see the last commit too; Get would not wait either way
		requireGone(t, d, "acct", "k", "the uncommitted claim is invisible")
	}
	completeAndCommit(t, tx, res.Record, `{"id":1}`)
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.Equal(t, `{"id":1}`, string(rec.Response.Body))

	// A replay is answered from the committed record, no transaction left open.
	requireLost(t, tc, params("acct", "k", "body"), idemdriver.DecisionReplay)
	requireLost(t, tc, params("acct", "k", "other body"), idemdriver.DecisionKeyReused)
}

func oneCommitRollbackLeavesNothing(t *testing.T, h Harness) {
	t.Parallel()
	ctx := context.Background()
	d, tc := txClaimer(t, h)
	_, tx := ownTx(t, tc)
	require.NoError(t, tx.Rollback(ctx))
	requireGone(t, d, "acct", "k", "no record, no lease to wait out")
	// The retry claims at once, as a new key.
	again := claim(t, d, params("acct", "k", "body"))
	require.True(t, again.Claimed)
	require.EqualValues(t, 1, again.Record.FencingToken)
}

func oneCommitRollbackRestoresFailed(t *testing.T, h Harness) {
	t.Parallel()
	ctx := context.Background()
	d, tc := txClaimer(t, h)
	first := claim(t, d, params("acct", "k", "body"))
	require.True(t, wrote(t, d.Fail, fence(first.Record)))
	res, tx := ownTx(t, tc, "a FAILED record is re-claimed")
	require.EqualValues(t, 2, res.Record.Attempts)
	require.Equal(t, first.Record.CreatedAt, res.Record.CreatedAt, "the record's life continues")
	require.NoError(t, tx.Rollback(ctx))
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateFailed, rec.State, "the rollback restores the record as it was")
}

func oneCommitLiveLeaseIsInFlight(t *testing.T, h Harness) {
	t.Parallel()
	d, tc := txClaimer(t, h)
	claim(t, d, params("acct", "k", "body"))
	requireLost(t, tc, params("acct", "k", "body"), idemdriver.DecisionInFlight)
}

func oneCommitDuplicateWaitsThenReplays(t *testing.T, h Harness) {
	t.Parallel()
	ctx := context.Background()
	_, tc := txClaimer(t, h)
	res, tx := ownTx(t, tc)
	dup := make(chan claimTxResult, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		r, tx, err := tc.ClaimTx(ctx, params("acct", "k", "body"), 20*time.Second)
		dup <- claimTxResult{r, tx, err}
	}()
	<-started
	completeAndCommit(t, tx, res.Record, `{"id":1}`)
	got := <-dup
	require.NoError(t, got.err)
	require.False(t, got.res.Claimed, "the owner committed: the duplicate gets its record")
	require.Nil(t, got.tx)
	require.Equal(t, idemdriver.StateSucceeded, got.res.Record.State)
	require.Equal(t, `{"id":1}`, string(got.res.Record.Response.Body))
}

func oneCommitDuplicateClaimsAfterRollback(t *testing.T, h Harness) {
	t.Parallel()
	ctx := context.Background()
	d, tc := txClaimer(t, h)
	_, tx := ownTx(t, tc)
	dup := make(chan claimTxResult, 1)
	go func() {
		r, tx, err := tc.ClaimTx(ctx, params("acct", "k", "body"), 20*time.Second)
		dup <- claimTxResult{r, tx, err}
	}()
	require.NoError(t, tx.Rollback(ctx))
	got := <-dup
	require.NoError(t, got.err)
	require.True(t, got.res.Claimed, "the owner rolled back: the duplicate (or the retry) claims at once")
	completeAndCommit(t, got.tx, got.res.Record, `{"id":2}`)
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
}

// oneCommitWaitBound: a duplicate waits for the owner at most its bound: on
// the owner's new row, and (takeover) on a row lock, the owner's uncommitted
// takeover of a FAILED record. The owner is not disturbed: it still commits.
func oneCommitWaitBound(takeover bool) func(*testing.T, Harness) {
	return func(t *testing.T, h Harness) {
		t.Parallel()
		if h.SingleWriter {
			t.Skip("a single writer's ClaimTx waits for the database's write lock (its busy timeout), not a per-key bound")
		}
		ctx := context.Background()
		d, tc := txClaimer(t, h)
		if takeover {
			first := claim(t, d, params("acct", "k", "body"))
			require.True(t, wrote(t, d.Fail, fence(first.Record)))
		}
		res, tx := ownTx(t, tc)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, dupTx, err := tc.ClaimTx(ctx, params("acct", "k", "body"), 300*time.Millisecond)
		require.ErrorIs(t, err, idemdriver.ErrLockWait)
		require.Nil(t, dupTx)
		completeAndCommit(t, tx, res.Record, `{"id":1}`)
	}
}

// N requests race on one key through the middleware in the one-commit
// mode: one handler run, one business row; every other request gets
// the replay (after waiting on the row lock) or 409.
func oneCommitRaceOneBusinessRow(t *testing.T, h Harness) {
	t.Parallel()
	d, _ := txClaimer(t, h)
	biz := h.Business(t, d)
	a := &app{biz: biz, rowPrefix: "oc:"}
	s := newServer(t, d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 20 * time.Second}}}, a)
	var wg sync.WaitGroup
	answers := make(chan answer, racers)
	start := make(chan struct{})
	for range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers <- s.post(t, "k", `{"amount":1}`)
		}()
	}
	close(start)
	wg.Wait()
	close(answers)
	counts := map[int]int{}
	replays := 0
	for g := range answers {
		require.NoError(t, g.err)
		counts[g.status]++
		if g.header.Get(idem.HeaderReplayed) == "true" {
			replays++
		}
	}
	require.EqualValues(t, 1, a.runs.Load(), "exactly one handler run")
	require.Equal(t, 1, rows(t, biz, "oc:k/1"), "exactly one business row")
	require.Equal(t, racers, counts[201]+counts[409], "answers: %v", counts)
	require.Equal(t, counts[201]-1, replays, "every 201 but the owner's is a replay")
}

// Requests of distinct keys never answer each other's wait: on a
// single writer they queue for the write lock (a bound on one key's
// wait must not refuse them), elsewhere they lock distinct rows.
func oneCommitDistinctKeysAllRun(t *testing.T, h Harness) {
	t.Parallel()
	d, _ := txClaimer(t, h)
	biz := h.Business(t, d)
	a := &app{biz: biz, rowPrefix: "dk:"}
	cfg := idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}}
	if h.SingleWriter {
		cfg.Engine.OneCommit.Wait = time.Millisecond // the bound that would refuse queued writers
	}
	s := newServer(t, d, cfg, a)
	const n = 32
	var wg sync.WaitGroup
	var unavailable atomic.Int32
	statuses := make(chan int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				a := s.post(t, "key-"+strconv.Itoa(i), `{"amount":1}`)
				require.NoError(t, a.err)
				// On a loaded machine the queue for the write lock can outlast
				// the claim's own bound (ClaimTimeout): 503, retried as a
				// client would. The key's wait bound never answers (409).
				if a.status == http.StatusServiceUnavailable && a.header.Get("Retry-After") != "" {
					unavailable.Add(1)
					continue
				}
				statuses <- a.status
				return
			}
		}()
	}
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for st := range statuses {
		counts[st]++
	}
	require.Equal(t, map[int]int{201: n}, counts, "every distinct key runs")
	// Each 503 rolled back whatever its run wrote, so a retry may run again.
	require.GreaterOrEqual(t, a.runs.Load(), int32(n))
	require.LessOrEqual(t, a.runs.Load(), int32(n)+unavailable.Load(), "a key runs again only after a 503")
	if unavailable.Load() == 0 {
		require.EqualValues(t, n, a.runs.Load(), "every distinct key ran once")
	}
}

// A handler that fails (5xx) or panics rolls its claim back with its
// writes: the retry runs at once, as a new request.
func oneCommitFailureAndPanicLeaveNothing(t *testing.T, h Harness) {
	t.Parallel()
	d, _ := txClaimer(t, h)
	biz := h.Business(t, d)
	a := &app{biz: biz, rowPrefix: "fp:", panicOn: 2, status: func(run int32) int {
		if run == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusCreated
	}}
	t.Cleanup(func() { a.writes.check(t) })
	m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		func() {
			defer func() { _ = recover() }()
			m.Handler(a).ServeHTTP(rec, req)
		}()
		return rec
	}
	require.Equal(t, 503, serve().Code)
	requireGone(t, d, idem.SingleTenantScope, "k", "a 5xx rolls the claim back: nothing left")
	serve() // run 2 panics
	requireGone(t, d, idem.SingleTenantScope, "k", "a panic rolls the claim back: nothing left")
	require.Equal(t, 201, serve().Code, "the retry runs at once")
	require.EqualValues(t, 3, a.runs.Load())
	for run, want := range map[string]int{"fp:k/1": 0, "fp:k/2": 0, "fp:k/3": 1} {
		require.Equal(t, want, rows(t, biz, run), "business rows of %s", run)
	}
	again := serve()
	require.Equal(t, 201, again.Code)
	require.Equal(t, "true", again.Header().Get(idem.HeaderReplayed))
	require.EqualValues(t, 3, a.runs.Load(), "the replay runs nothing")
}

// ReleaseKey in the one-commit mode frees the key even when the claim
// continued an earlier (FAILED) record.
func oneCommitReleaseFreesTheKey(t *testing.T, h Harness) {
	t.Parallel()
	d, _ := txClaimer(t, h)
	// Durable-claim mode leaves the key FAILED (a 503)...
	durable := newHandlerServer(t, d, idem.Options{}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	require.Equal(t, 503, durable.post(t, "k", `{"a":1}`).status)
	rec := record(t, d, idem.SingleTenantScope, "k")
	require.Equal(t, idemdriver.StateFailed, rec.State)
	// ...which the same request re-claims in the one-commit mode and
	// releases (a validation failure): the rollback restores the FAILED
	// record, and idem still removes it.
	release := true
	s := newHandlerServer(t, d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}}, func(w http.ResponseWriter, r *http.Request) {
		if release {
			if err := idem.ReleaseKey(r.Context()); err != nil {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	require.Equal(t, 400, s.post(t, "k", `{"a":1}`).status)
	requireGone(t, d, idem.SingleTenantScope, "k", "the released key has no record")
	release = false
	require.Equal(t, 201, s.post(t, "k", `{"a":2}`).status, "a corrected request runs as new, not 422")
}

func oneCommitStatementBudget(t *testing.T, h Harness) {
	t.Parallel()
	require.NotNil(t, h.NewCountingDriver, "the harness must count statements")
	d, count := h.NewCountingDriver(t)
	if _, ok := d.(idemdriver.TxClaimer); !ok {
		t.Skipf("%T does not implement idemdriver.TxClaimer", d)
	}
	want, ok := h.Budget["first-one-commit"]
	require.True(t, ok, "the harness gives no budget for first-one-commit")
	wantReplay, ok := h.Budget["replay-one-commit"]
	require.True(t, ok, "the harness gives no budget for replay-one-commit")
	biz := h.Business(t, d)
	m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	a := &app{biz: biz}
	t.Cleanup(func() { a.writes.check(t) })
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		m.Handler(a).ServeHTTP(rec, req)
		return rec
	}
	before := count()
	rec := serve()
	require.Equal(t, 201, rec.Code, rec.Body.String())
	require.EqualValues(t, want, count()-before-1, "statements for a one-commit first execution (one business write not counted)")
	before = count()
	rec = serve()
	require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed), rec.Body.String())
	require.EqualValues(t, wantReplay, count()-before, "statements for a one-commit replay")
}

func oneCommitConfigNeedsTxClaimer(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	_, err := idem.NewMiddleware(noTxClaimer{d}, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: idem.SingleTenant})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "TxClaimer"), err.Error())
	require.False(t, errors.Is(err, idemdriver.ErrLockWait))
}

// claimTxResult is what a concurrent ClaimTx returned.
type claimTxResult struct {
	res idemdriver.ClaimResult
	tx  idemdriver.Tx
	err error
}

// noTxClaimer hides a driver's optional interfaces.
type noTxClaimer struct{ idemdriver.Driver }
