package idemsqlite_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/internal/parked"
)

// SQLite never answers 503 for a busy, healthy database (issue 13 item 8).
// These cases hold SQLite's one write lock with a handler that writes in
// the claim's transaction, as a live owner does, and check what the other
// requests get.

func globalScope(*http.Request) (string, error) { return "global", nil }

func post(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// holdWriteLock returns a handler, writing in the claim's transaction, that
// holds SQLite's write lock (its business transaction is open) until
// release is closed, and closes started when it holds it.
func holdWriteLock(runs *atomic.Int32, started, release chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `CREATE TABLE IF NOT EXISTS payments (id TEXT)`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1"}`))
	})
}

// A duplicate that arrives while the owner's transaction holds the write
// lock, after the owner's lease ran out as the database sees it (a
// single writer's owner does not renew while its transaction is open), is
// answered 409 from the record, not 503 after ClaimTimeout; once the owner
// commits, it gets the replay. The handler runs once.
func TestDuplicateDuringOwnersTransactionIs409(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	owner, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}}, Scope: globalScope})
	require.NoError(t, err)
	h := owner.Handler(holdWriteLock(&runs, started, release))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k") }()
	<-started

	// The duplicate sees the database's clock past the owner's lease.
	clock := &idemdrivertest.Clock{}
	clock.Advance(2 * time.Second)
	dupMW, err := idem.NewMiddleware(idemdrivertest.Shift(d, clock), idem.Options{
		Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}, Timeouts: idem.TimeoutOptions{Claim: 300 * time.Millisecond}},
		Scope:  globalScope,
	})
	require.NoError(t, err)
	dup := dupMW.Handler(holdWriteLock(&runs, make(chan struct{}), release))
	w := post(dup, "k")
	require.Equal(t, http.StatusConflict, w.Code, "a live owner holding the write lock: %s", w.Body.String())
	require.Contains(t, w.Body.String(), "request-in-flight")
	require.NotEmpty(t, w.Header().Get("Retry-After"))

	close(release)
	require.Equal(t, http.StatusCreated, (<-first).Code)
	w = post(dup, "k")
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	require.Equal(t, "true", w.Header().Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

// An execution whose renewals queue behind another execution's open
// transaction (SQLite's write lock, in the same process) for longer than a
// lease keeps its lease: no claim can take the key over while that lock is
// held. It used to give up ("lease not renewed for a whole lease") and
// answer 503 although the database was healthy.
func TestRenewalQueuedBehindAnotherTransactionKeepsTheLease(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	const lease = time.Second
	m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: lease}}, Scope: globalScope})
	require.NoError(t, err)

	// B runs without a transaction until A's transaction has ended.
	var bRuns atomic.Int32
	bStarted, aDone := make(chan struct{}), make(chan struct{})
	b := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bRuns.Add(1)
		close(bStarted)
		<-aDone
		w.WriteHeader(http.StatusCreated)
	}))
	bAnswer := make(chan *httptest.ResponseRecorder, 1)
	go func() { bAnswer <- post(b, "b") }()
	<-bStarted

	// A holds the write lock for two and a half of B's leases.
	var aRuns atomic.Int32
	aStarted, aRelease := make(chan struct{}), make(chan struct{})
	a := m.Handler(holdWriteLock(&aRuns, aStarted, aRelease))
	aAnswer := make(chan *httptest.ResponseRecorder, 1)
	go func() { aAnswer <- post(a, "a") }()
	<-aStarted
	time.Sleep(lease * 5 / 2)
	close(aRelease)
	require.Equal(t, http.StatusCreated, (<-aAnswer).Code)
	close(aDone)

	w := <-bAnswer
	require.Equal(t, http.StatusCreated, w.Code, "B's renewals only queued: %s", w.Body.String())
	rec, err := d.Get(context.Background(), idemdriver.GetParams{Scope: "global", Key: "b"})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.EqualValues(t, 1, bRuns.Load())
}

// Regression (review of a139c0b): the one-commit duplicates' wait in the
// process was bounded by OneCommitWait on SQLite too, where the bound is
// not used (a duplicate queues for the database's one write lock, as every
// transaction does, and gets the replay): a duplicate got 409 instead.
func TestOneCommitDuplicateQueuesForTheWriteLock(t *testing.T) {
	d := dbtest.SQLite(t)
	// Any wait is past a 1 ns bound, once the duplicate waits.
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: time.Nanosecond}}, Scope: globalScope})
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	owner := make(chan *httptest.ResponseRecorder, 1)
	go func() { owner <- post(h, "k") }()
	<-entered
	dup := make(chan *httptest.ResponseRecorder, 1)
	go func() { dup <- post(h, "k") }()
	parked.Wait(t, 2, "idemsqlite_test.TestOneCommitDuplicateQueuesForTheWriteLock.func") // the owner runs, the duplicate waits
	close(release)
	require.Equal(t, http.StatusCreated, (<-owner).Code)
	res := <-dup
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(t, "true", res.Header().Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}
