package idempgx_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/internal/parked"
)

// A one-commit execution whose process dies mid-transaction (its backend
// terminated, as when the process is killed and its connection drops)
// leaves nothing behind: no record, no lease to wait out; the retry
// claims at once.
func TestOneCommitCrashLeavesNothing(t *testing.T) {
	ctx := context.Background()
	d := openDriver(t, false, nil)
	p := idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/v1/payments",
		Fingerprint: make([]byte, 32), LeaseDuration: time.Minute, Retention: time.Hour}
	res, tx, err := d.ClaimTx(ctx, p, time.Second)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	pid := tx.Native().(pgx.Tx).Conn().PgConn().PID()

	// A duplicate waits on the key's row lock meanwhile.
	dup := make(chan idemdriver.ClaimResult, 1)
	go func() {
		r, dtx, err := d.ClaimTx(ctx, p, 20*time.Second)
		if err == nil && dtx != nil {
			defer dtx.Rollback(ctx)
		}
		if err != nil {
			t.Errorf("duplicate: %v", err)
		}
		dup <- r
	}()
	var killed bool
	require.NoError(t, d.Pool().QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
	require.True(t, killed)
	got := <-dup
	require.Error(t, tx.Rollback(ctx), "the owner's connection is gone") // and goes back to the pool, closed
	require.True(t, got.Claimed, "the duplicate claims as soon as the dead owner's transaction is gone")
	require.EqualValues(t, 1, got.Record.Attempts, "a new record: the dead claim left nothing")
}

// smallPoolApp is a migrated store and business table "biz" on a pool of
// two connections, for the tests of what one-commit requests do to a pool.
func smallPoolApp(t *testing.T) (*idempgx.Driver, *pgxpool.Pool, string) { return poolApp(t, 2) }

// poolApp is smallPoolApp with a pool of conns connections.
func poolApp(t *testing.T, conns int32) (*idempgx.Driver, *pgxpool.Pool, string) {
	t.Helper()
	url, schema := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d := idempgx.New(pool)
	require.NoError(t, d.Migrate(context.Background()))
	_, err = pool.Exec(context.Background(), `CREATE TABLE biz (k text NOT NULL)`)
	require.NoError(t, err)
	return d, pool, schema + ".biz"
}

// writeBiz inserts key into biz in the claim's transaction, or answers 500
// and reports false.
func writeBiz(w http.ResponseWriter, r *http.Request, biz, key string) bool {
	tx, err := idem.Tx[pgx.Tx](r.Context())
	if err == nil {
		_, err = tx.Exec(r.Context(), `INSERT INTO `+biz+` (k) VALUES ($1)`, key)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return false
	}
	return true
}

// answerOf serves one POST of key through h in the background.
func answerOf(h http.Handler, key string) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() { out <- send(h, key) }()
	return out
}

// awaitAnswer is the answer from out; a request still unanswered after a
// minute is a hang, reported as such (no speed is asserted).
func awaitAnswer(t *testing.T, out <-chan *httptest.ResponseRecorder, what string) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case res := <-out:
		return res
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer after a minute", what)
		return nil
	}
}

// Regression (review of 0b0b976): duplicates of a one-commit key each held
// a connection while they waited on its row lock, so a storm of retries of
// one key took the pool and every other key's request waited behind them.
// Now the duplicates of this process wait for their turn without a
// connection; another key is answered while the key's owner runs. The
// storm comes after the owner's claim, with it (review of 1f0c7eb: nothing
// held them before the first claim answered), or waits through a first run
// that rolls back (review of 1f0c7eb: every waiter then went to the row
// lock at once); then the duplicates get the replay of the run that
// committed.
func TestOneCommitDuplicatesLeaveThePoolToOtherKeys(t *testing.T) {
	for _, storm := range []struct {
		name                string
		withOwner, rollback bool
	}{{"AfterTheClaim", false, false}, {"WithTheClaim", true, false}, {"ThroughARollback", false, true}} {
		t.Run(storm.name, func(t *testing.T) {
			d, pool, biz := smallPoolApp(t)
			held := make(chan chan struct{}) // each run of "slow" sends its release
			var releases []chan struct{}
			t.Cleanup(func() { // before the pool closes: a failed run must not hang there
				for _, r := range releases {
					close(r)
				}
			})
			var runs atomic.Int64
			mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 10 * time.Minute}}, Scope: idem.SingleTenant})
			require.NoError(t, err)
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key := r.Header.Get(idem.HeaderKey)
				run := runs.Add(1)
				if !writeBiz(w, r, biz, key) {
					return
				}
				if key == "slow" {
					release := make(chan struct{})
					held <- release
					<-release
					if storm.rollback && run == 1 {
						http.Error(w, "the first run fails", http.StatusInternalServerError)
						return
					}
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"key":%q,"run":%d}`, key, run)
			}))
			// requireOtherKeyServed checks, once the run of "slow" and its
			// duplicates (blocked of them in all) are all blocked (the
			// duplicates in the process, or, as before the fix, on the pool or
			// the row lock), that another key gets the second connection.
			requireOtherKeyServed := func(key string, blocked int) {
				parked.Wait(t, blocked, "idempgx_test.answerOf")
				other := awaitAnswer(t, answerOf(h, key), "another key's request while the owner runs")
				require.Equal(t, http.StatusCreated, other.Code, other.Body.String())
			}

			var owner <-chan *httptest.ResponseRecorder
			var dups []<-chan *httptest.ResponseRecorder
			storming := func() {
				for range 10 {
					dups = append(dups, answerOf(h, "slow"))
				}
			}
			owner = answerOf(h, "slow")
			if storm.withOwner {
				storming()
			}
			releases = append(releases, <-held) // the first run holds one connection
			if !storm.withOwner {
				storming()
			}
			requireOtherKeyServed("other-1", 11) // the owner and its ten duplicates
			first := releases[0]
			releases = releases[1:]
			close(first)
			wantRun := 1
			if storm.rollback {
				require.Equal(t, http.StatusInternalServerError, awaitAnswer(t, owner, "the failing first run").Code)
				releases = append(releases, <-held)  // a duplicate runs the key again
				requireOtherKeyServed("other-2", 10) // the second run and nine duplicates
				second := releases[0]
				releases = releases[1:]
				close(second)
				wantRun = 3 // after the failed run and other-1's
			} else {
				// With the claim, any of the eleven may be the owner.
				dups = append(dups, owner)
			}
			created, replays := 0, 0
			for i, dup := range dups {
				res := awaitAnswer(t, dup, "a duplicate")
				require.Equal(t, http.StatusCreated, res.Code, "duplicate %d: %s", i, res.Body.String())
				require.JSONEq(t, fmt.Sprintf(`{"key":"slow","run":%d}`, wantRun), res.Body.String(), "duplicate %d", i)
				if res.Header().Get(idem.HeaderReplayed) == "true" {
					replays++
				} else {
					created++
				}
			}
			require.Equal(t, [2]int{1, len(dups) - 1}, [2]int{created, replays}, "one request ran the key (again), the others replayed it")
			var rows int
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+biz+` WHERE k = 'slow'`).Scan(&rows))
			require.Equal(t, 1, rows, "one committed run of the key")
		})
	}
}

// The wait for a key held by this process is bounded by OneCommitWait as
// the wait on its row lock is: past it, 409 with Retry-After, and the
// owner still commits.
func TestOneCommitLocalWaitIsBounded(t *testing.T) {
	d, _, biz := smallPoolApp(t)
	entered, release := make(chan struct{}), make(chan struct{})
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 100 * time.Millisecond}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !writeBiz(w, r, biz, "k") {
			return
		}
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	owner := answerOf(h, "k")
	<-entered
	for range 3 {
		res := awaitAnswer(t, answerOf(h, "k"), "a duplicate past the wait bound")
		require.Equal(t, http.StatusConflict, res.Code, res.Body.String())
		require.Equal(t, "1", res.Header().Get("Retry-After"))
		require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"))
	}
	close(release)
	require.Equal(t, http.StatusCreated, awaitAnswer(t, owner, "the owner").Code)
	res := send(h, "k")
	require.Equal(t, "true", res.Header().Get(idem.HeaderReplayed))
}

// Regression (review of 0b0b976): a one-commit claim waited for a pool
// connection as long as the whole execution may last, though ClaimTimeout
// bounds a claim. Now ClaimTimeout + OneCommitWait bounds it: 503.
func TestOneCommitClaimBoundedWhenThePoolIsTaken(t *testing.T) {
	d, pool, _ := smallPoolApp(t)
	var held []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		held = append(held, c)
	}
	t.Cleanup(func() {
		for _, c := range held {
			c.Release()
		}
	})
	mw, err := idem.NewMiddleware(d, idem.Options{
		Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 100 * time.Millisecond}, Timeouts: idem.TimeoutOptions{Claim: 100 * time.Millisecond}},
		Scope:  idem.SingleTenant,
	})
	require.NoError(t, err)
	var runs atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	res := awaitAnswer(t, answerOf(h, "k"), "a claim with no connection to be had")
	require.Equal(t, http.StatusServiceUnavailable, res.Code, res.Body.String())
	require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"))
	require.NotEmpty(t, res.Header().Get("Retry-After"))
	require.Zero(t, runs.Load(), "the handler never runs unprotected")
}

// Regression (review of a139c0b): every request of a key, a replay's too,
// held the key in the process while it claimed, so a burst of retries of a
// completed key was answered one claim at a time and the last ones got 409
// past OneCommitWait. A replay of a key nobody holds goes to the store at
// once.
func TestOneCommitBurstOfReplaysIsNotQueued(t *testing.T) {
	d, _, biz := poolApp(t, 16)
	// A bound shorter than 500 claims one after another take, and longer
	// than one claim behind 500 on 16 connections.
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 100 * time.Millisecond}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if !writeBiz(w, r, biz, "k") {
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	require.Equal(t, http.StatusCreated, send(h, "k").Code)
	var burst []<-chan *httptest.ResponseRecorder
	for range 500 {
		burst = append(burst, answerOf(h, "k"))
	}
	codes := map[string]int{}
	for _, out := range burst {
		res := awaitAnswer(t, out, "a replay")
		codes[fmt.Sprintf("%d replayed=%s", res.Code, res.Header().Get(idem.HeaderReplayed))]++
	}
	require.Equal(t, map[string]int{"201 replayed=true": 500}, codes)
	require.EqualValues(t, 1, runs.Load())
}

// Regression (review of a139c0b): a request that waited in the process for
// the key's owner then claimed with what was left of OneCommitWait, which
// on PostgreSQL is the transaction's lock_timeout: its handler's own lock
// waits had less time the longer it had queued. Every one-commit
// transaction gets the whole bound.
func TestOneCommitWaiterGetsTheWholeLockBound(t *testing.T) {
	d, _, _ := smallPoolApp(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 2 * time.Second}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[pgx.Tx](r.Context())
		var bound string
		if err == nil {
			err = tx.QueryRow(r.Context(), `SELECT current_setting('lock_timeout')`).Scan(&bound)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if runs.Add(1) == 1 {
			close(entered)
			<-release
			http.Error(w, "the first run fails", http.StatusInternalServerError) // rolled back: the waiter claims
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(bound))
	}))
	owner := answerOf(h, "k")
	<-entered
	dup := answerOf(h, "k")
	parked.Wait(t, 2, "idempgx_test.answerOf") // the owner runs; the duplicate waits in the process
	free()
	require.Equal(t, http.StatusInternalServerError, awaitAnswer(t, owner, "the owner").Code)
	res := awaitAnswer(t, dup, "the waiter")
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(t, "2s", res.Body.String(), "the waiter's transaction has the whole lock bound")
}

// blockedWriter is a client that reads nothing: every write waits for
// release; wrote is closed at the first.
type blockedWriter struct {
	*httptest.ResponseRecorder
	wrote, release chan struct{}
	once           sync.Once
}

func (b *blockedWriter) Write(p []byte) (int, error) {
	b.once.Do(func() { close(b.wrote) })
	<-b.release
	return b.ResponseRecorder.Write(p)
}

// sendUnread serves a POST of key through h to a client that reads
// nothing, and returns once the answer is being written: the claim's
// transaction has ended by then.
func sendUnread(t *testing.T, h http.Handler, key string) {
	t.Helper()
	b := &blockedWriter{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { close(b.release) })
	go h.ServeHTTP(b, post(key))
	<-b.wrote
}

// Regression (review of bba86a9): the leader's turn ended only after its
// response was sent, so while its client read slowly the key's duplicates
// got 409 though the record had committed. The turn ends with the
// transaction: they get the replay while the owner's client still reads.
func TestOneCommitSlowOwnerClientDoesNotHoldTheKey(t *testing.T) {
	d, _, biz := smallPoolApp(t)
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 200 * time.Millisecond}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !writeBiz(w, r, biz, "k") {
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	sendUnread(t, h, "k") // committed: the response is being sent, and not read
	requireReplays := func(what string) {
		t.Helper()
		for i := range 3 {
			res := awaitAnswer(t, answerOf(h, "k"), what)
			require.Equal(t, http.StatusCreated, res.Code, "%s %d: %s", what, i, res.Body.String())
			require.Equal(t, "true", res.Header().Get(idem.HeaderReplayed), "%s %d", what, i)
		}
	}
	requireReplays("a duplicate while the owner's client reads")

	// The same for a request that only got the replay and whose client
	// reads slowly (review of c07035c).
	sendUnread(t, h, "k")
	requireReplays("a retry while another retry's client reads")
}

// claimCounter counts the one-commit claims a pool sends (pgx batches
// holding the claim statement).
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "INSERT INTO idem_keys") {
			c.n.Add(1)
		}
	}
	return ctx
}
func (c *claimCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *claimCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Regression (review of bba86a9): when another process holds the key, the
// leader of this process's duplicates waits on the row lock; the others'
// bound ran out meanwhile and each then claimed on its own, every one of
// them waiting on the row lock with a connection. Past the bound they get
// 409 without going to the database.
func TestOneCommitDuplicatesOfAKeyAnotherProcessHolds(t *testing.T) {
	a, _, biz := smallPoolApp(t) // "the other process": its own pool and Middleware
	url := a.Pool().Config().ConnString()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	counter := &claimCounter{}
	cfg.ConnConfig.Tracer = counter
	poolB, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(poolB.Close)
	b := idempgx.New(poolB)

	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	handler := func(hold bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !writeBiz(w, r, biz, "k") {
				return
			}
			if hold {
				close(entered)
				<-release
			}
			w.WriteHeader(http.StatusCreated)
		})
	}
	mwA, err := idem.NewMiddleware(a, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	mwB, err := idem.NewMiddleware(b, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 500 * time.Millisecond}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	owner := answerOf(mwA.Handler(handler(true)), "k")
	<-entered
	hB := mwB.Handler(handler(false))
	var dups []<-chan *httptest.ResponseRecorder
	for range 10 {
		dups = append(dups, answerOf(hB, "k"))
	}
	for i, dup := range dups {
		res := awaitAnswer(t, dup, "a duplicate in the other process")
		require.Equal(t, http.StatusConflict, res.Code, "duplicate %d: %s", i, res.Body.String())
	}
	// A wave's leader claims; a waiter whose bound had not run out when
	// that claim gave up may lead one more. Not every duplicate.
	require.LessOrEqual(t, counter.n.Load(), int64(3), "claims sent by the 10 duplicates")
	free()
	require.Equal(t, http.StatusCreated, awaitAnswer(t, owner, "the owner").Code)
}

// Regression (the stress run of the turns' first version): a waiter whose
// OneCommitWait ran out while its leader's claim waited for a connection
// could get 409 once the leader found the key completed (select picked the
// expired bound over the ended turn at random). The leader's claim waits
// here for the pool's only connection, held by another key's run, far past
// the waiters' 1 ns bound.
func TestOneCommitWaiterPastItsBoundWhileTheClaimIsDecidedGetsTheReplay(t *testing.T) {
	d, _, biz := poolApp(t, 1)
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: time.Nanosecond}, Timeouts: idem.TimeoutOptions{Claim: time.Minute}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idem.HeaderKey)
		runs.Add(1)
		if !writeBiz(w, r, biz, key) {
			return
		}
		if key == "other" {
			close(entered)
			<-release // holds the only connection, in its transaction
		}
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusCreated, send(h, "k").Code)
	other := answerOf(h, "other")
	<-entered
	var burst []<-chan *httptest.ResponseRecorder
	for range 20 {
		burst = append(burst, answerOf(h, "k"))
	}
	parked.Wait(t, 21, "idempgx_test.answerOf") // the run of "other", k's leader on the pool, 19 waiters
	close(release)
	require.Equal(t, http.StatusCreated, awaitAnswer(t, other, "other").Code)
	codes := map[string]int{}
	for _, out := range burst {
		res := awaitAnswer(t, out, "a replay")
		codes[fmt.Sprintf("%d replayed=%s", res.Code, res.Header().Get(idem.HeaderReplayed))]++
	}
	require.Equal(t, map[string]int{"201 replayed=true": 20}, codes)
	require.EqualValues(t, 2, runs.Load())
}
