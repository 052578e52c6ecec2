package idempgx_test

import (
	"context"
	"errors"
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
	"github.com/idemgo/idem/seal"
)

// Adversarial tests of the completion+COMMIT pipeline and of the handler's
// deferred-BEGIN transaction (claimTx), end to end through the middleware
// against a real PostgreSQL.

// execModes are pgx's exec modes (default_query_exec_mode).
var execModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// txApp is a migrated store on a fresh schema with a business table "rows"
// (no unique constraint: every committed execution leaves one row), on a
// pool whose connections carry a unique application_name so that leaks can
// be found in pg_stat_activity.
type txApp struct {
	t     *testing.T
	d     *idempgx.Driver
	pool  *pgxpool.Pool
	app   string
	table string
}

var txAppN atomic.Int64

func newTxApp(t *testing.T, mode string) *txApp {
	t.Helper()
	url, schema := dbtest.PostgresURL(t)
	if mode != "" {
		url += "&default_query_exec_mode=" + mode
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 8
	app := fmt.Sprintf("idemtx_%s_%d", schema, txAppN.Add(1))
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		// pool.Close waits for every acquired connection: a leaked one
		// would hang the test run instead of failing it.
		done := make(chan struct{})
		go func() { pool.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("pool.Close blocked: a connection was never given back to the pool")
		}
	})
	d := idempgx.New(pool)
	require.NoError(t, d.Migrate(context.Background()))
	_, err = pool.Exec(context.Background(), `CREATE TABLE biz (k text NOT NULL, n serial PRIMARY KEY)`)
	require.NoError(t, err)
	return &txApp{t: t, d: d, pool: pool, app: app, table: schema + ".biz"}
}

func (b *txApp) rows(key string) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.table+` WHERE k = $1`, key).Scan(&n))
	return n
}

func (b *txApp) state(key string) string {
	b.t.Helper()
	rec, err := b.d.Get(context.Background(), idemdriver.GetParams{Scope: "global", Key: key})
	if errors.Is(err, idemdriver.ErrNotFound) {
		return "absent"
	}
	require.NoError(b.t, err)
	return string(rec.State)
}

// noLeak waits (bounded) for every connection to be back in the pool, and
// checks that no backend of the pool is left inside a transaction.
func (b *txApp) noLeak() {
	b.t.Helper()
	var acquired int32
	var inTx int
	for i := 0; i < 100; i++ {
		acquired = b.pool.Stat().AcquiredConns()
		inTx = b.idleInTx()
		if acquired == 0 && inTx == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(b.t, [2]int{0, 0}, [2]int{int(acquired), inTx},
		"[connections still acquired from the pool, backends left idle in transaction]: both must be 0")
}

func (b *txApp) idleInTx() int {
	b.t.Helper()
	conn, err := pgx.Connect(context.Background(), dbtest.RequireURL(b.t, dbtest.EnvPostgres))
	require.NoError(b.t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(b.t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, b.app).Scan(&n))
	return n
}

func (b *txApp) insert(ctx context.Context, tx pgx.Tx, key string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (k) VALUES ($1)`, key)
	return err
}

func send(h http.Handler, key string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, post(key))
	return rec
}

// post is the request send sends: POST /v1/payments with key.
func post(key string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set(idem.HeaderKey, key)
	return req
}

func (b *txApp) mw(cfg idem.Options) *idem.Middleware {
	b.t.Helper()
	cfg.Scope = idem.SingleTenant
	m, err := idem.NewMiddleware(b.d, cfg)
	require.NoError(b.t, err)
	return m
}

// inEveryMode runs f in a parallel subtest on a fresh txApp for each of
// modes (pgx exec modes; "" is the default) and both of idem's modes.
func inEveryMode(t *testing.T, modes []string, f func(t *testing.T, b *txApp, oneCommit bool)) {
	for _, mode := range modes {
		for _, oneCommit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/oneCommit=%v", mode, oneCommit), func(t *testing.T) {
				t.Parallel()
				f(t, newTxApp(t, mode), oneCommit)
			})
		}
	}
}

// retryCommitsOnce sends key through h twice: the first answer, checked by
// first, commits nothing and leaks nothing; the retry runs and commits one
// row.
func (b *txApp) retryCommitsOnce(h http.Handler, key string, first func(res *httptest.ResponseRecorder)) {
	b.t.Helper()
	first(send(h, key))
	require.Zero(b.t, b.rows(key))
	b.noLeak()
	res := send(h, key)
	require.Equal(b.t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(b.t, 1, b.rows(key))
	b.noLeak()
}

// counted is a protected handler (idem's modes as in cfg) that hands the
// claim's transaction to body with the number of its run (1 for the
// first), then answers 201; runs counts the executions.
func (b *txApp) counted(cfg idem.Options, body func(ctx context.Context, tx pgx.Tx, run int64)) (h http.Handler, runs *atomic.Int64) {
	runs = new(atomic.Int64)
	h = b.mw(cfg).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		tx, err := idem.Tx[pgx.Tx](r.Context())
		require.NoError(b.t, err)
		body(r.Context(), tx, run)
		w.WriteHeader(http.StatusCreated)
	}))
	return h, runs
}

// notSucceeded is a first answer of retryCommitsOnce: anything but 201.
func notSucceeded(t *testing.T) func(*httptest.ResponseRecorder) {
	return func(res *httptest.ResponseRecorder) { require.NotEqual(t, http.StatusCreated, res.Code) }
}

// lockedCompletion is a middleware whose completion outlives
// CompleteTimeout: the handler writes a row for key and, before it
// answers 201, has *locker (a transaction of its own, left open) take the
// record's row lock, as a takeover in flight would.
func (b *txApp) lockedCompletion(key string, locker *pgx.Tx) http.Handler {
	ctx := context.Background()
	return b.mw(idem.Options{Engine: idem.EngineOptions{Timeouts: idem.TimeoutOptions{Complete: 300 * time.Millisecond}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[pgx.Tx](r.Context())
		require.NoError(b.t, err)
		require.NoError(b.t, b.insert(r.Context(), tx, key))
		*locker, err = b.pool.Begin(ctx)
		require.NoError(b.t, err)
		_, err = (*locker).Exec(ctx, `SELECT 1 FROM idem_keys WHERE key = $1 FOR UPDATE`, key)
		require.NoError(b.t, err)
		w.WriteHeader(http.StatusCreated)
	}))
}

// A takeover while the handler runs (the record's fencing token moves on):
// the completion is fenced out and the business write must not commit, in
// every exec mode, whatever the handler's first statement was.
func TestHandlerTxFencedOutEndToEndEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := newTxApp(t, mode)
			firsts := map[string]func(ctx context.Context, tx pgx.Tx, key string) error{
				"exec": b.insert,
				"query": func(ctx context.Context, tx pgx.Tx, key string) error {
					var n int
					return tx.QueryRow(ctx, `INSERT INTO `+b.table+` (k) VALUES ($1) RETURNING n`, key).Scan(&n)
				},
				"savepoint": func(ctx context.Context, tx pgx.Tx, key string) error {
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					if err := b.insert(ctx, sp, key); err != nil {
						return err
					}
					return sp.Commit(ctx)
				},
				"copy": func(ctx context.Context, tx pgx.Tx, key string) error {
					_, err := tx.CopyFrom(ctx, pgx.Identifier{strings.Split(b.table, ".")[0], "biz"}, []string{"k"}, pgx.CopyFromRows([][]any{{key}}))
					return err
				},
			}
			m := b.mw(idem.Options{})
			for name, first := range firsts {
				key := "fenced-" + name
				h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, err := idem.Tx[pgx.Tx](r.Context())
					require.NoError(t, err)
					require.NoError(t, first(r.Context(), tx, key))
					// another worker takes the key over
					_, err = b.pool.Exec(context.Background(), `UPDATE idem_keys SET fencing_token = fencing_token + 1 WHERE key = $1`, key)
					require.NoError(t, err)
					w.WriteHeader(http.StatusCreated)
				}))
				res := send(h, key)
				require.NotEqual(t, http.StatusCreated, res.Code, "%s: a fenced-out completion is not a success", name)
				require.Zero(t, b.rows(key), "%s: the fenced-out execution's write did not commit", name)
				require.Equal(t, "PROCESSING", b.state(key), name)
				b.noLeak()
			}
		})
	}
}

// A handler whose first use of the transaction is tx.Conn() (pgx.Tx's
// "the underlying *Conn on which this transaction is executing") must write
// inside the transaction: a 500 rolls it back, and nothing stays.
func TestHandlerTxConnFirstStatementRunsInTheTransaction(t *testing.T) {
	t.Parallel()
	inEveryMode(t, []string{""}, func(t *testing.T, b *txApp, oneCommit bool) {
		h := b.mw(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := idem.Tx[pgx.Tx](r.Context())
			require.NoError(t, err)
			_, err = tx.Conn().Exec(r.Context(), `INSERT INTO `+b.table+` (k) VALUES ('conn')`)
			require.NoError(t, err)
			http.Error(w, "provider declined", http.StatusInternalServerError)
		}))
		res := send(h, "conn")
		require.Equal(t, http.StatusInternalServerError, res.Code)
		require.Zero(t, b.rows("conn"), "the write through tx.Conn() was rolled back with the transaction")
		b.noLeak()
	})
}

// A stray goroutine of a handler that keeps its tx after idem committed:
// every method must refuse (pgx.ErrTxClosed), and none may reach the
// connection that went back to the pool.
func TestHandlerTxStrayGoroutineAfterCommit(t *testing.T) {
	t.Parallel()
	for _, oneCommit := range []bool{false, true} {
		for _, used := range []bool{true, false} {
			t.Run(fmt.Sprintf("oneCommit=%v/used=%v", oneCommit, used), func(t *testing.T) {
				t.Parallel()
				b := newTxApp(t, "")
				var kept pgx.Tx
				h := b.mw(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, err := idem.Tx[pgx.Tx](r.Context())
					require.NoError(t, err)
					if used {
						require.NoError(t, b.insert(r.Context(), tx, "stray"))
					}
					kept = tx
					w.WriteHeader(http.StatusCreated)
				}))
				require.Equal(t, http.StatusCreated, send(h, "stray").Code)
				ctx := context.Background()
				ins := `INSERT INTO ` + b.table + ` (k) VALUES ('late')`
				_, err := kept.Exec(ctx, ins)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "Exec")
				_, err = kept.Exec(ctx, ins, pgx.QueryExecModeSimpleProtocol)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "Exec with a mode")
				_, err = kept.Query(ctx, ins)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "Query")
				require.ErrorIs(t, kept.QueryRow(ctx, ins).Scan(), pgx.ErrTxClosed, "QueryRow")
				bt := &pgx.Batch{}
				bt.Queue(ins)
				require.ErrorIs(t, kept.SendBatch(ctx, bt).Close(), pgx.ErrTxClosed, "SendBatch")
				_, err = kept.CopyFrom(ctx, pgx.Identifier{"biz"}, []string{"k"}, pgx.CopyFromRows([][]any{{"late"}}))
				require.ErrorIs(t, err, pgx.ErrTxClosed, "CopyFrom")
				_, err = kept.Prepare(ctx, "p", ins)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "Prepare")
				_, err = kept.Begin(ctx)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "Begin")
				lo := kept.LargeObjects()
				_, err = lo.Create(ctx, 0)
				require.ErrorIs(t, err, pgx.ErrTxClosed, "LargeObjects")
				require.ErrorIs(t, kept.Commit(ctx), pgx.ErrTxClosed, "Commit")
				require.ErrorIs(t, kept.Rollback(ctx), pgx.ErrTxClosed, "Rollback")
				require.Zero(t, b.rows("late"))

				// tx.Conn(): pgx's own Tx hands out the connection still;
				// but here it is the pool's again, maybe another request's.
				var conn *pgx.Conn
				require.NotPanics(t, func() { conn = kept.Conn() }, "Conn() after idem committed")
				if conn != nil {
					_, err = conn.Exec(ctx, `SELECT set_config('application_name', 'stray-goroutine', false)`)
					require.Error(t, err, "a stray goroutine ran a statement on a connection that went back to the pool")
				}
				b.noLeak()
			})
		}
	}
}

// A handler that took the transaction but ran nothing in it and answered
// 500 (idem rolls back a transaction never begun: the connection goes back
// to the pool); a stray goroutine then asks for tx.Conn().
func TestHandlerTxConnOfANeverBegunTransactionAfterRollback(t *testing.T) {
	t.Parallel()
	b := newTxApp(t, "")
	var kept pgx.Tx
	h := b.mw(idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[pgx.Tx](r.Context())
		require.NoError(t, err)
		kept = tx
		http.Error(w, "declined", http.StatusInternalServerError)
	}))
	require.Equal(t, http.StatusInternalServerError, send(h, "never").Code)
	b.noLeak()
	_, err := kept.Exec(context.Background(), `SELECT 1`)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.NotPanics(t, func() { _ = kept.Conn() }, "Conn() of an ended transaction")
}

// The completion outlives CompleteTimeout (its UPDATE waits for a row lock
// another transaction holds), so the request is answered 503 while the
// pipeline goes on; that transaction then takes the key over, so the
// completion is fenced out and the server skips the COMMIT. Nothing may be
// committed, and the business transaction must still be rolled back and
// its connection given back: an aborted transaction keeps its locks.
func TestHandlerTxPendingCompletionFencedOutIsRolledBack(t *testing.T) {
	t.Parallel()
	b := newTxApp(t, "")
	ctx := context.Background()
	var locker pgx.Tx
	res := send(b.lockedCompletion("pending", &locker), "pending")
	require.Equal(t, http.StatusServiceUnavailable, res.Code, res.Body.String())
	_, err := locker.Exec(ctx, `UPDATE idem_keys SET fencing_token = fencing_token + 1 WHERE key = 'pending'`)
	require.NoError(t, err)
	require.NoError(t, locker.Commit(ctx))
	require.Zero(t, b.rows("pending"))
	b.noLeak()
}

// The same, when the lock holder lets go without a takeover: the pending
// completion commits with the business write, and the connection is back.
func TestHandlerTxPendingCompletionCommits(t *testing.T) {
	t.Parallel()
	b := newTxApp(t, "")
	var locker pgx.Tx
	h := b.lockedCompletion("pending-ok", &locker)
	res := send(h, "pending-ok")
	require.Equal(t, http.StatusServiceUnavailable, res.Code, res.Body.String())
	require.NoError(t, locker.Commit(context.Background()))
	b.noLeak()
	require.Equal(t, 1, b.rows("pending-ok"))
	require.Equal(t, "SUCCEEDED", b.state("pending-ok"))
	// the retry replays
	res = send(h, "pending-ok")
	require.Equal(t, http.StatusCreated, res.Code)
	require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
}

// Duplicates at once, every exec mode, both modes: the handler's write
// commits exactly once.
func TestHandlerTxConcurrentDuplicatesCommitOnce(t *testing.T) {
	t.Parallel()
	inEveryMode(t, execModes, func(t *testing.T, b *txApp, oneCommit bool) {
		var runs atomic.Int64
		h := b.mw(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			tx, err := idem.Tx[pgx.Tx](r.Context())
			if err == nil {
				err = b.insert(r.Context(), tx, "dup")
			}
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		var wg sync.WaitGroup
		var created atomic.Int64
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if send(h, "dup").Code == http.StatusCreated {
					created.Add(1)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, b.rows("dup"), "one committed execution")
		require.Equal(t, int64(1), runs.Load(), "one execution")
		require.GreaterOrEqual(t, created.Load(), int64(1))
		b.noLeak()
	})
}

// A unique violation in the handler's transaction, then 2xx: 500
// transaction-aborted, nothing committed, FAILED; then 409: replayed. With
// sealing too: the 409 recorded on its own after the transaction aborted
// (in one-commit mode under a new claim, whose record's life the seal
// binds) replays.
func TestHandlerTxFailedStatementThenAnswer(t *testing.T) {
	t.Parallel()
	inEveryMode(t, execModes, func(t *testing.T, b *txApp, oneCommit bool) {
		ctx := context.Background()
		_, err := b.pool.Exec(ctx, `CREATE TABLE uniq (id int PRIMARY KEY); INSERT INTO uniq VALUES (1)`)
		require.NoError(t, err)
		failedStatementThenAnswer(t, b, idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}, "")
		failedStatementThenAnswer(t, b, idem.EngineOptions{
			OneCommit: idem.OneCommitOptions{Enabled: oneCommit},
			Sealing:   idem.SealingOptions{Keys: []seal.Key{{ID: "A", Secret: make([]byte, 32)}}},
		}, "-sealed")
	})
}

// failedStatementThenAnswer is TestHandlerTxFailedStatementThenAnswer on
// one configuration, its keys ending with suffix.
func failedStatementThenAnswer(t *testing.T, b *txApp, cfg idem.EngineOptions, suffix string) {
	t.Helper()
	oneCommit := cfg.OneCommit.Enabled
	answer := http.StatusCreated
	h := b.mw(idem.Options{Engine: cfg}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[pgx.Tx](r.Context())
		require.NoError(t, err)
		require.NoError(t, b.insert(r.Context(), tx, r.Header.Get(idem.HeaderKey)))
		_, err = tx.Exec(r.Context(), `INSERT INTO uniq VALUES (1)`)
		require.Error(t, err)
		w.WriteHeader(answer)
	}))
	res := send(h, "u2xx"+suffix)
	require.Equal(t, http.StatusInternalServerError, res.Code)
	require.Zero(t, b.rows("u2xx"+suffix))
	if oneCommit {
		require.Equal(t, "absent", b.state("u2xx"+suffix), "the claim rolled back with the transaction")
	} else {
		require.Equal(t, "FAILED", b.state("u2xx"+suffix))
	}
	b.noLeak()
	answer = http.StatusConflict
	res = send(h, "u409"+suffix)
	require.Equal(t, http.StatusConflict, res.Code)
	require.Zero(t, b.rows("u409"+suffix))
	res = send(h, "u409"+suffix)
	require.Equal(t, http.StatusConflict, res.Code, "%s", res.Body)
	require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
	b.noLeak()
}

// A deferred foreign key fails at COMMIT, in every exec mode and both
// modes: the rows are gone, 503, and the retry runs again.
func TestHandlerTxDeferredConstraintAtCommit(t *testing.T) {
	t.Parallel()
	inEveryMode(t, execModes, func(t *testing.T, b *txApp, oneCommit bool) {
		ctx := context.Background()
		_, err := b.pool.Exec(ctx, `CREATE TABLE parents (id int PRIMARY KEY);
			CREATE TABLE children (parent_id int REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		h, runs := b.counted(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}, func(ctx context.Context, tx pgx.Tx, run int64) {
			require.NoError(t, b.insert(ctx, tx, "fk"))
			stmt := `INSERT INTO children VALUES (42)` // no parent 42: the COMMIT fails
			if run > 1 {
				stmt = `INSERT INTO parents VALUES (42)`
			}
			_, err := tx.Exec(ctx, stmt)
			require.NoError(t, err)
		})
		b.retryCommitsOnce(h, "fk", func(res *httptest.ResponseRecorder) {
			require.Equal(t, http.StatusServiceUnavailable, res.Code, res.Body.String())
			require.Contains(t, []string{"FAILED", "absent"}, b.state("fk"))
		})
		require.Equal(t, int64(2), runs.Load())
	})
}

// The server kills the business transaction's backend while the handler
// runs: nothing commits, the answer is not a success, the pool is clean,
// and the retry commits exactly once.
func TestHandlerTxBackendKilledMidHandler(t *testing.T) {
	t.Parallel()
	inEveryMode(t, execModes, func(t *testing.T, b *txApp, oneCommit bool) {
		h, _ := b.counted(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}, func(ctx context.Context, tx pgx.Tx, run int64) {
			require.NoError(t, b.insert(ctx, tx, "killed"))
			if run == 1 {
				var pid uint32 = tx.Conn().PgConn().PID()
				_, err := b.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int(pid))
				require.NoError(t, err)
			}
		})
		// The retry runs at once: Fail, or the rolled-back one-commit
		// claim, freed the key.
		b.retryCommitsOnce(h, "killed", notSucceeded(t))
	})
}

// The handler commits or rolls back the transaction itself (against the
// contract): no leak, and a commit is recorded and replayed.
func TestHandlerTxHandlerEndsTheTransaction(t *testing.T) {
	t.Parallel()
	for _, oneCommit := range []bool{false, true} {
		for _, deferred := range []bool{false, true} {
			t.Run(fmt.Sprintf("oneCommit=%v/noStatement=%v", oneCommit, deferred), func(t *testing.T) {
				t.Parallel()
				b := newTxApp(t, "")
				h := b.mw(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, err := idem.Tx[pgx.Tx](r.Context())
					require.NoError(t, err)
					if !deferred {
						require.NoError(t, b.insert(r.Context(), tx, "self"))
					}
					require.NoError(t, tx.Commit(r.Context()))
					w.WriteHeader(http.StatusCreated)
				}))
				res := send(h, "self")
				require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
				b.noLeak()
				res = send(h, "self")
				require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
				require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
				if !deferred {
					require.Equal(t, 1, b.rows("self"))
				}
				b.noLeak()
			})
		}
	}
}

// The client hangs up while the handler runs, and the handler's next
// statement runs on the request's context: whatever the answer, the
// business write and the record agree, and nothing leaks.
func TestHandlerTxClientCancelsMidHandler(t *testing.T) {
	t.Parallel()
	inEveryMode(t, []string{""}, func(t *testing.T, b *txApp, oneCommit bool) {
		ctx, cancel := context.WithCancel(context.Background())
		h := b.mw(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := idem.Tx[pgx.Tx](r.Context())
			require.NoError(t, err)
			require.NoError(t, b.insert(r.Context(), tx, "hangup"))
			cancel()
			if err := b.insert(r.Context(), tx, "hangup"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`)).WithContext(ctx)
		req.Header.Set(idem.HeaderKey, "hangup")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		n, st := b.rows("hangup"), b.state("hangup")
		if rec.Code == http.StatusCreated {
			require.Equal(t, 2, n)
			require.Equal(t, "SUCCEEDED", st)
		} else {
			require.Zero(t, n, "answered %d", rec.Code)
			require.NotEqual(t, "SUCCEEDED", st)
		}
		b.noLeak()
	})
}

// The server ends the session of a business transaction left idle past
// idle_in_transaction_session_timeout (SET LOCAL in the transaction) while
// the handler waits: nothing commits, the answer is not a success, the
// retry commits exactly once.
func TestHandlerTxIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	inEveryMode(t, execModes, func(t *testing.T, b *txApp, oneCommit bool) {
		h, _ := b.counted(idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: oneCommit}}}, func(ctx context.Context, tx pgx.Tx, run int64) {
			if run == 1 {
				_, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 100`)
				require.NoError(t, err)
			}
			require.NoError(t, b.insert(ctx, tx, "idle"))
			if run == 1 {
				pid := int(tx.Conn().PgConn().PID())
				for i := 0; i < 200; i++ { // until the server ended the session
					var alive bool
					require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive))
					if !alive {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
		b.retryCommitsOnce(h, "idle", notSucceeded(t))
	})
}
