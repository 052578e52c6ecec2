package idempgx_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// The pipelines (the completion with its COMMIT, BEGIN with the one-commit
// claim) keep their promises in every exec mode, where pgx sends a batch
// differently: an extended-protocol pipeline with one Sync, or one
// multi-statement query in the simple protocol. A completion that fails or
// is fenced out must leave the COMMIT sent after it without effect.
func TestPipelinesInEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		for _, partitioned := range []bool{false, true} {
			name := mode
			if partitioned {
				name += "/partitioned"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				url, _ := dbtest.PostgresURL(t)
				cfg, err := pgxpool.ParseConfig(url + "&default_query_exec_mode=" + mode)
				require.NoError(t, err)
				cfg.MaxConns = 4
				d := storeOn(t, cfg, partitioned)
				biz := newBusiness(t, d)
				ctx := context.Background()
				claimAt := func(key string, offset time.Duration) idemdriver.ClaimResult {
					t.Helper()
					res, err := d.Claim(ctx, claimParams(key, offset))
					require.NoError(t, err)
					require.True(t, res.Claimed, key)
					return res
				}
				begin := func(row string) (idemdriver.Tx, idemdriver.CompleteCommitter) {
					t.Helper()
					tx, err := d.Begin(ctx)
					require.NoError(t, err)
					require.NoError(t, biz.Insert(ctx, tx, row))
					return tx, tx.(idemdriver.CompleteCommitter)
				}
				count := func(row string) int {
					t.Helper()
					n, err := biz.Count(ctx, row)
					require.NoError(t, err)
					return n
				}
				state := func(key string) idemdriver.State {
					t.Helper()
					rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: key})
					require.NoError(t, err)
					return rec.State
				}

				// Fenced out: taken over while the transaction was open.
				old := claimAt("fenced", 0)
				tx, cc := begin("row-fenced")
				claimAt("fenced", time.Minute)
				ok, err := cc.CompleteCommit(ctx, completion(old.Record, 0))
				require.NoError(t, err)
				require.False(t, ok)
				require.NoError(t, tx.Rollback(ctx))
				require.Zero(t, count("row-fenced"), "the COMMIT after a fenced-out completion committed nothing")

				// Aborted: a statement of the handler failed (a unique
				// violation), so the completion cannot be written.
				res := claimAt("aborted", 0)
				tx, cc = begin("row-aborted")
				require.Error(t, biz.Insert(ctx, tx, "row-aborted"), "a unique violation")
				_, err = cc.CompleteCommit(ctx, completion(res.Record, 0))
				require.ErrorIs(t, err, idemdriver.ErrTxAborted)
				require.NoError(t, tx.Rollback(ctx))
				require.Zero(t, count("row-aborted"))
				require.Equal(t, idemdriver.StateProcessing, state("aborted"))

				// Both commit, and the connection goes back to the pool idle.
				res = claimAt("ok", 0)
				tx, cc = begin("row-ok")
				ok, err = cc.CompleteCommit(ctx, completion(res.Record, 0))
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, 1, count("row-ok"))
				require.Equal(t, idemdriver.StateSucceeded, state("ok"))
				native := tx.Native().(pgx.Tx)
				_, err = native.Exec(ctx, "SELECT 1")
				require.ErrorIs(t, err, pgx.ErrTxClosed, "the handler's transaction is closed once idem committed it")
				require.Zero(t, d.Pool().Stat().AcquiredConns())

				// One-commit: BEGIN, the lock bound and the claim in one
				// batch; a duplicate waits at most its bound.
				res, tx, err = d.ClaimTx(ctx, claimParams("one", 0), time.Second)
				require.NoError(t, err)
				require.True(t, res.Claimed)
				require.NoError(t, biz.Insert(ctx, tx, "row-one"))
				_, _, err = d.ClaimTx(ctx, claimParams("one", 0), 50*time.Millisecond)
				require.ErrorIs(t, err, idemdriver.ErrLockWait)
				ok, err = tx.(idemdriver.CompleteCommitter).CompleteCommit(ctx, completion(res.Record, 0))
				require.NoError(t, err)
				require.True(t, ok)
				res, tx, err = d.ClaimTx(ctx, claimParams("one", 0), time.Second)
				require.NoError(t, err)
				require.False(t, res.Claimed)
				require.Nil(t, tx)
				require.Equal(t, idemdriver.StateSucceeded, res.Record.State)
				require.Equal(t, 1, count("row-one"))
				require.Zero(t, d.Pool().Stat().AcquiredConns())
			})
		}
	}
}

func claimParams(key string, offset time.Duration) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: "acct", Key: key, Method: "POST", Path: "/", Fingerprint: []byte{1},
		LeaseDuration: 30 * time.Second, Retention: time.Hour, ClockOffset: offset}
}

func completion(rec idemdriver.Record, offset time.Duration) idemdriver.CompleteParams {
	return idemdriver.CompleteParams{
		FenceParams: idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken,
			CreatedAt: rec.CreatedAt, ClockOffset: offset},
		Response: idemdriver.Response{Status: 201, Body: []byte(`{}`), BodyStored: true, BodySize: 2},
	}
}

// roundTrips counts the exchanges pgx starts with the server: a statement
// sent alone, or a batch sent whole (a prepare, once per statement and
// connection, is not counted).
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A first execution's round trips to PostgreSQL, a business write in the
// claim's transaction included: in transactional mode the claim, BEGIN, the
// write and the completion with its COMMIT (4; the statements by hand, one
// each, take 5); in one-commit mode BEGIN with the claim, the write, and the
// completion with the COMMIT (3, against 5 one statement at a time).
func TestFirstExecutionRoundTrips(t *testing.T) {
	t.Parallel()
	tracer := &roundTrips{}
	d := openDriver(t, false, tracer)
	biz := newBusiness(t, d)
	for _, tc := range []struct {
		name      string
		oneCommit bool
		want      int64
	}{{"transactional", false, 4}, {"one-commit", true, 3}} {
		m, err := idem.New(idem.Config{Scope: idem.SingleTenant, Store: d, OneCommit: tc.oneCommit})
		require.NoError(t, err)
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := idemdriver.TxFromContext(r.Context())
			if err == nil {
				err = biz.Insert(r.Context(), tx, r.Header.Get(idem.HeaderKey))
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		for i, key := range []string{"warm-up", "measured"} {
			req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
			req.Header.Set(idem.HeaderKey, tc.name+"-"+key)
			rec := httptest.NewRecorder()
			before := tracer.n.Load()
			h.ServeHTTP(rec, req)
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			if i == 1 {
				require.Equal(t, tc.want, tracer.n.Load()-before, tc.name)
			}
		}
	}
}
