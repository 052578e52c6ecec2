package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
)

// galeraFingerprint is every request's fingerprint in these tests, so that
// a durable claim made by hand names the same request.
var galeraFingerprint = []byte(strings.Repeat("g", 32))

// oneCommitOn returns a one-commit middleware on d (one process attached to
// d's node), waiting at most wait, observed by obs (nil: none).
func oneCommitOn(t *testing.T, d *idemmysql.Driver, wait time.Duration, obs idem.Observer) *idem.Middleware {
	t.Helper()
	mw, err := idem.NewMiddleware(d, idem.Options{
		Engine:  idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: 10 * time.Second}, Waiting: idem.WaitOptions{Max: wait}, Observer: obs},
		Scope:   idem.SingleTenant,
		Request: idem.RequestOptions{Fingerprint: func(*http.Request, []byte) []byte { return galeraFingerprint }},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Engine().Close() })
	return mw
}

// postPayment sends POST /v1/payments with key to h.
func postPayment(h http.Handler, key string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idem.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// createCharges creates the business table galera_charges: a row per
// business write of key k.
func createCharges(t *testing.T, d *idemmysql.Driver) {
	t.Helper()
	_, err := d.DB().Exec(`CREATE TABLE galera_charges (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL) ENGINE = InnoDB`)
	require.NoError(t, err)
}

// countCharges returns the committed business writes of key, read on d.
func countCharges(t *testing.T, d *idemmysql.Driver, key string) int {
	t.Helper()
	var n int
	require.NoError(t, d.DB().QueryRow(`SELECT count(*) FROM galera_charges WHERE k = ?`, key).Scan(&n))
	return n
}

// charge is a handler's business write of key in the claim's transaction:
// a read of key's rows (causal: Open sets wsrep_sync_wait), then an INSERT.
func charge(r *http.Request, key string) error {
	tx, err := idem.Tx[*sql.Tx](r.Context())
	if err != nil {
		return err
	}
	var n int
	if err := tx.QueryRowContext(r.Context(), `SELECT count(*) FROM galera_charges WHERE k = ?`, key).Scan(&n); err != nil {
		return err
	}
	_, err = tx.ExecContext(r.Context(), `INSERT INTO galera_charges (k) VALUES (?)`, key)
	return err
}

// fail answers 500 from a handler (require cannot stop a test from the
// handler's goroutine); the test then fails on the 5xx.
func fail(w http.ResponseWriter, err error) {
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// Requests of one key on two nodes in one-commit mode: each node's claim is
// an uncommitted row that the other node does not see, so both nodes' first
// requests claim and run the handler (each waits at a barrier for the
// other's, so that every round runs the race), and at COMMIT the later one
// loses certification (1213), or is aborted by the winner's write set
// before its COMMIT (1213 at the completion). Its business write does not
// commit, and it is answered from the winner's record, read again causally
// (wsrep_sync_wait): a replay. Regression (issue 32): the loser was
// answered 503 store-unavailable.
func TestGaleraOneCommitClaimsOnTwoNodes(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	createCharges(t, d1)
	const rounds, perNode = 5, 4
	for round := range rounds {
		key := fmt.Sprintf("k%d", round)
		var ran atomic.Int32
		both := make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := charge(r, key); err != nil {
				fail(w, err)
				return
			}
			if ran.Add(1) == 2 {
				close(both)
			}
			select {
			case <-both:
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"charged":"`+key+`"}`)
		})
		var mu sync.Mutex
		var lost []idem.Event
		obs := idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventLeaseLost {
				mu.Lock()
				lost = append(lost, e)
				mu.Unlock()
			}
		})
		nodes := []http.Handler{oneCommitOn(t, d1, 0, obs).Handler(h), oneCommitOn(t, d2, 0, obs).Handler(h)}
		answers := make([]*httptest.ResponseRecorder, 2*perNode)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = postPayment(nodes[i%2], key) })
		}
		wg.Wait()
		require.EqualValues(t, 2, ran.Load(), "round %d: both nodes' handlers ran (the race took place), and no other", round)
		fresh := 0
		for i, a := range answers {
			require.Less(t, a.Code, 500, "round %d, request %d on node %d: %s", round, i, i%2+1, a.Body.String())
			require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, a.Code, "round %d: %s", round, a.Body.String())
			if a.Code == http.StatusCreated {
				require.Equal(t, `{"charged":"`+key+`"}`, a.Body.String())
				if a.Header().Get(idem.HeaderReplayed) == "" {
					fresh++
				}
			}
		}
		require.Equal(t, 1, fresh, "round %d: one answer is the winner's own, every other 201 a replay", round)
		require.Len(t, lost, 1, "round %d: one execution lost", round)
		require.Equal(t, http.StatusCreated, lost[0].Status, "round %d: the loser read the winner's record causally: its replay", round)
		require.ErrorIs(t, lost[0].Err, idemdriver.ErrConflict, "round %d", round)
		require.Equal(t, 1, countCharges(t, d2, key), "round %d: one business write committed", round)
	}
}

// A one-commit execution whose transaction loses a conflict with a write
// committed on another node that is not a claim of its key (here a business
// row both update): nothing of it commits, no record of the key is left,
// and it is answered a retryable 409; the retry runs again and commits.
// Regression (issue 32): answered 503.
func TestGaleraOneCommitConflictWithoutWinner(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	ctx := context.Background()
	_, err := d1.DB().Exec(`CREATE TABLE galera_counter (id INT PRIMARY KEY, n INT NOT NULL) ENGINE = InnoDB`)
	require.NoError(t, err)
	_, err = d1.DB().Exec(`INSERT INTO galera_counter VALUES (1, 0)`)
	require.NoError(t, err)
	var ran atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err != nil {
			fail(w, err)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `UPDATE galera_counter SET n = n + 1 WHERE id = 1`); err != nil {
			fail(w, err)
			return
		}
		if ran.Add(1) == 1 { // another node's write to the row commits first
			// Causal (wsrep_sync_wait 15): node 2 has applied the row's INSERT.
			res, err := d2.DB().ExecContext(r.Context(), `SET STATEMENT wsrep_sync_wait=15 FOR UPDATE galera_counter SET n = n + 100 WHERE id = 1`)
			var n int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			if err != nil || n != 1 {
				fail(w, fmt.Errorf("node 2's write: %d rows, %v", n, err))
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	node1 := oneCommitOn(t, d1, 0, nil).Handler(h)

	a := postPayment(node1, "k")
	require.Equal(t, http.StatusConflict, a.Code, a.Body.String())
	require.Contains(t, a.Body.String(), idem.ProblemTypeBase+"request-in-flight")
	require.Equal(t, "1", a.Header().Get("Retry-After"))
	require.Contains(t, a.Body.String(), "conflicted with another transaction committed first")
	_, err = d2.Get(ctx, idemdriver.GetParams{Scope: idem.SingleTenantScope, Key: "k"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "nothing of the loser committed, its claim neither")
	var n int
	require.NoError(t, d1.DB().QueryRow(`SELECT n FROM galera_counter WHERE id = 1`).Scan(&n))
	require.Equal(t, 100, n, "the loser's write did not commit")

	a = postPayment(node1, "k")
	require.Equal(t, http.StatusCreated, a.Code, a.Body.String())
	require.Empty(t, a.Header().Get(idem.HeaderReplayed), "the retry ran")
	require.EqualValues(t, 2, ran.Load())
	require.NoError(t, d2.DB().QueryRow(`SELECT n FROM galera_counter WHERE id = 1`).Scan(&n))
	require.Equal(t, 101, n)
}

// A one-commit execution that loses its COMMIT to a durable claim of its
// key committed on another node (a process in durable-claim mode, live) is
// answered as a claim that finds it: 409 request-in-flight, or, when the
// request waits (Prefer: wait), the owner's outcome once it is recorded.
// Regression (issue 32): answered 503.
func TestGaleraOneCommitLostToALiveClaim(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			d1, d2 := galeraPair(t, "")
			p := galeraClaim("k")
			p.Scope, p.Fingerprint = idem.SingleTenantScope, galeraFingerprint
			var owner atomic.Pointer[idemdriver.ClaimResult]
			var ran atomic.Int32
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran.Add(1)
				res, err := d2.Claim(r.Context(), p) // commits on node 2, before this COMMIT
				if err != nil || !res.Claimed {
					fail(w, fmt.Errorf("the claim on node 2: %+v %w", res, err))
					return
				}
				owner.Store(&res)
				w.WriteHeader(http.StatusCreated)
			})
			mw := oneCommitOn(t, d1, time.Minute, nil)
			if !wait {
				a := postPayment(mw.Handler(h), "k")
				require.Equal(t, http.StatusConflict, a.Code, a.Body.String())
				require.Contains(t, a.Body.String(), idem.ProblemTypeBase+"request-in-flight")
				require.NotEmpty(t, a.Header().Get("Retry-After"))
				require.EqualValues(t, 1, ran.Load())
				return
			}
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- postPayment(mw.Handler(h), "k", "Prefer", "wait=60") }()
			require.Eventually(t, func() bool { return mw.Engine().Waiters() == 1 || len(done) == 1 }, 30*time.Second, 5*time.Millisecond)
			require.Empty(t, done, "the loser waits for node 2's owner")
			galeraComplete(t, d2, p, *owner.Load())
			a := <-done
			require.Equal(t, http.StatusCreated, a.Code, a.Body.String())
			require.Equal(t, "true", a.Header().Get(idem.HeaderReplayed))
			require.Equal(t, `{}`, a.Body.String(), "node 2's outcome")
			require.EqualValues(t, 1, ran.Load())
		})
	}
}

// The loser of a race of one key on two nodes whose handler is still
// running when the winner commits: applying the winner's write set aborts
// the loser's transaction (a brute-force abort), so the handler's next
// statement fails with 1213 and the handler answers its error (500), as it
// must; or, in a few rounds in a hundred, MariaDB 10.11 reports no error at
// all: the transaction is gone and the statements that follow run outside
// it. Either way nothing of the loser commits, and the key has a committed
// outcome: the loser is answered 409 (retry: the winner's replay), not the
// handler's 5xx. Regressions (issue 32): the handler's 500 was sent; after
// a silent abort the loser's business write committed (in autocommit).
func TestGaleraOneCommitHandlerStatementLosesToAnotherNode(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	createCharges(t, d1)
	const rounds = 40
	statementFailed := 0
	for round := range rounds {
		key := fmt.Sprintf("k%d", round)
		claimed2, answered1 := make(chan struct{}), make(chan struct{})
		var failed atomic.Value
		node1 := oneCommitOn(t, d1, 0, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-claimed2 // node 2's claim is made: it runs too
			if err := charge(r, key); err != nil {
				fail(w, err)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		node2 := oneCommitOn(t, d2, 0, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(claimed2)
			<-answered1 // node 1 committed
			// charge's causal read: node 1's write set is applied first, aborting this transaction
			if err := charge(r, key); err != nil {
				failed.Store(err)
				fail(w, err)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		var a1, a2 *httptest.ResponseRecorder
		var wg sync.WaitGroup
		wg.Go(func() {
			a1 = postPayment(node1, key)
			close(answered1)
		})
		wg.Go(func() { a2 = postPayment(node2, key) })
		wg.Wait()
		require.Equal(t, http.StatusCreated, a1.Code, "round %d: %s", round, a1.Body.String())
		require.Equal(t, 1, countCharges(t, d2, key), "round %d: one business write committed (node 2's statement failed: %v)", round, failed.Load())
		if failed.Load() != nil {
			statementFailed++
		}
		if a2.Header().Get(idem.HeaderReplayed) == "" { // else its statements ran, and its COMMIT lost: the replay
			require.Equal(t, http.StatusConflict, a2.Code, "round %d: %s (its statement: %v)", round, a2.Body.String(), failed.Load())
			require.Contains(t, a2.Body.String(), idem.ProblemTypeBase+"request-in-flight")
			require.Contains(t, a2.Body.String(), "conflicted with another transaction committed first")
		}
		a2 = postPayment(node2, key)
		require.Equal(t, http.StatusCreated, a2.Code, "round %d: the retry: %s", round, a2.Body.String())
		require.Equal(t, "true", a2.Header().Get(idem.HeaderReplayed), "round %d: the retry replays node 1's outcome", round)
		require.Equal(t, 1, countCharges(t, d2, key), "round %d: one business write committed", round)
	}
	t.Logf("node 2's statement failed with 1213 in %d of %d rounds", statementFailed, rounds)
	requireAutocommit(t, d2)
}

// requireAutocommit checks that every connection of d's pool has autocommit
// on: a one-commit transaction's connection, whose autocommit is off while
// it runs on Galera, was set back or discarded.
func requireAutocommit(t *testing.T, d *idemmysql.Driver) {
	t.Helper()
	ctx := context.Background()
	var conns []*sql.Conn
	for range d.DB().Stats().Idle {
		c, err := d.DB().Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		var on int
		require.NoError(t, c.QueryRowContext(ctx, `SELECT @@autocommit`).Scan(&on))
		require.Equal(t, 1, on, "a pooled connection with autocommit off")
		require.NoError(t, c.Close())
	}
}

// Many keys, each sent at once by several clients to two nodes in
// one-commit mode, with no barrier: every interleaving of the two nodes'
// claims, handlers and COMMITs that the timing gives. Every key's business
// write commits once, and no answer is a 5xx (a lost race answers a replay
// or 409). The figures are logged for scripts/topology/galera. Before issue
// 32 three runs answered 10 to 22 x 503 (the loser's COMMIT or completion)
// and 2 to 15 x 500 (the loser's handler, its statement aborted) of 600.
func TestGaleraOneCommitStormOnTwoNodes(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	createCharges(t, d1)
	const keys, perNode = 100, 3
	var executions atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		key := r.Header.Get(idem.HeaderKey)
		if err := charge(r, key); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"charged":"`+key+`"}`)
	})
	var lost atomic.Int64
	obs := idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind == idem.EventLeaseLost {
			lost.Add(1)
		}
	})
	nodes := []http.Handler{oneCommitOn(t, d1, 0, obs).Handler(h), oneCommitOn(t, d2, 0, obs).Handler(h)}
	statuses := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("storm%d", k)
		for i := range 2 * perNode {
			wg.Go(func() {
				a := postPayment(nodes[i%2], key)
				s := fmt.Sprint(a.Code)
				if a.Header().Get(idem.HeaderReplayed) != "" {
					s += " replayed"
				}
				mu.Lock()
				statuses[s]++
				mu.Unlock()
				if a.Code >= 500 {
					t.Errorf("%s on node %d: %d %s", key, i%2+1, a.Code, a.Body.String())
				}
			})
		}
	}
	wg.Wait()
	rows, err := d2.DB().Query(`SELECT k, count(*) FROM galera_charges GROUP BY k HAVING count(*) <> 1`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		t.Errorf("%s: %d business writes committed", k, n)
	}
	require.NoError(t, rows.Err())
	var committed int
	require.NoError(t, d2.DB().QueryRow(`SELECT count(DISTINCT k) FROM galera_charges`).Scan(&committed))
	require.Equal(t, keys, committed, "every key's business write committed")
	t.Logf("one-commit storm on two nodes: %d keys x %d requests, %d executions (%d lost a race), %d business writes committed; answers %v",
		keys, 2*perNode, executions.Load(), lost.Load(), committed, statuses)
	requireAutocommit(t, d1)
	requireAutocommit(t, d2)
}
