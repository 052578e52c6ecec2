package idempgx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
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
)

// The pipelines (the completion with its COMMIT, BEGIN with the one-commit
// claim) keep their promises in every exec mode, where pgx sends a batch
// differently: an extended-protocol pipeline with one Sync, or one
// multi-statement query in the simple protocol. A completion that fails or
// is fenced out must leave the COMMIT sent after it without effect.
func TestPipelinesInEveryExecMode(t *testing.T) {
	t.Parallel()
	inEveryExecMode(t, 4, func(t *testing.T, _ string, d *idempgx.Driver) {
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
			require.NoError(t, biz.Insert(ctx, tx.Native(), row))
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
		require.Error(t, biz.Insert(ctx, tx.Native(), "row-aborted"), "a unique violation")
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

		// One-commit: BEGIN and the claim, which bounds the lock wait, in one
		// batch; a duplicate waits at most its bound.
		res, tx, err = d.ClaimTx(ctx, claimParams("one", 0), time.Second)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.NoError(t, biz.Insert(ctx, tx.Native(), "row-one"))
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

// A first execution's round trips to PostgreSQL, a business write in the
// claim's transaction included. Read first (Options.ClaimOrder): in
// durable-claim mode the claim's read and its INSERT, BEGIN with the
// write, and the completion with its COMMIT (4; the statements one at a
// time take 6); in one-commit mode the claim's read, BEGIN with the
// claim's INSERT, the write, and the completion with the COMMIT (4,
// against 6). INSERT first (a new driver's order): one round trip fewer in
// each.
func TestFirstExecutionRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		order     idempgx.ClaimOrder
		oneCommit bool
		want      int64
	}{
		{"durable claim, read first", idempgx.ClaimReadFirst, false, 4},
		{"one-commit, read first", idempgx.ClaimReadFirst, true, 4},
		{"durable claim, insert first", idempgx.ClaimInsertFirst, false, 3},
		{"one-commit, insert first", idempgx.ClaimInsertFirst, true, 3},
	} {
		tracer := &countingTracer{}
		d := openDriverOrder(t, false, tracer, tc.order)
		biz := newBusiness(t, d)
		m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: tc.oneCommit}}, Scope: idem.SingleTenant})
		require.NoError(t, err)
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := idem.Tx[any](r.Context())
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
			req.Header.Set(idem.HeaderKey, strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)+"-"+key)
			rec := httptest.NewRecorder()
			before := tracer.trips.Load()
			h.ServeHTTP(rec, req)
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			if i == 1 {
				require.Equal(t, tc.want, tracer.trips.Load()-before, tc.name)
			}
		}
	}
}

// The business transaction's BEGIN waits for its first statement, and
// whatever that statement is, it runs inside the transaction: rolled back,
// its row is gone; committed with the completion, it is there.
func TestDeferredBeginHoldsEveryFirstStatement(t *testing.T) {
	t.Parallel()
	d := openDriver(t, false, nil)
	table := newBusiness(t, d).(business).table
	insert := `INSERT INTO ` + table + ` (id) VALUES ($1)`
	ctx := context.Background()
	firsts := map[string]func(tx pgx.Tx, id string) error{
		"Exec": func(tx pgx.Tx, id string) error { _, err := tx.Exec(ctx, insert, id); return err },
		"Exec with an exec mode": func(tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, id)
			return err
		},
		"Exec with named arguments": func(tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id) VALUES (@id)`, pgx.NamedArgs{"id": id})
			return err
		},
		"Query": func(tx pgx.Tx, id string) error {
			rows, err := tx.Query(ctx, insert+` RETURNING id`, id)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"QueryRow": func(tx pgx.Tx, id string) error {
			var got string
			return tx.QueryRow(ctx, insert+` RETURNING id`, id).Scan(&got)
		},
		"SendBatch": func(tx pgx.Tx, id string) error {
			b := &pgx.Batch{}
			b.Queue(insert, id)
			return tx.SendBatch(ctx, b).Close()
		},
		"CopyFrom": func(tx pgx.Tx, id string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"id"}, pgx.CopyFromRows([][]any{{id}}))
			return err
		},
		"a savepoint": func(tx pgx.Tx, id string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, id); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"Prepare": func(tx pgx.Tx, id string) error {
			if _, err := tx.Prepare(ctx, "ins-"+id, insert); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ins-"+id, id)
			return err
		},
	}
	n := 0
	for name, first := range firsts {
		for _, commit := range []bool{true, false} {
			n++
			key, id := "deferred-"+strconv.Itoa(n), "row-"+strconv.Itoa(n)
			res, err := d.Claim(ctx, claimParams(key, 0))
			require.NoError(t, err)
			tx, err := d.Begin(ctx)
			require.NoError(t, err)
			native := tx.Native().(pgx.Tx)
			require.NotNil(t, native.Conn(), name)
			require.NoError(t, first(native, id), name)
			if commit {
				ok, err := tx.(idemdriver.CompleteCommitter).CompleteCommit(ctx, completion(res.Record, 0))
				require.NoError(t, err, name)
				require.True(t, ok, name)
			} else {
				require.NoError(t, tx.Rollback(ctx), name)
			}
			var rows int
			require.NoError(t, d.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE id = $1`, id).Scan(&rows))
			rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: key})
			require.NoError(t, err)
			if commit {
				require.Equal(t, 1, rows, "%s: committed with the completion", name)
				require.Equal(t, idemdriver.StateSucceeded, rec.State, name)
			} else {
				require.Zero(t, rows, "%s: the first statement ran inside the transaction", name)
				require.Equal(t, idemdriver.StateProcessing, rec.State, name)
			}
		}
	}

	// No statement at all: the completion commits on its own, BEGIN first.
	res, err := d.Claim(ctx, claimParams("deferred-none", 0))
	require.NoError(t, err)
	tx, err := d.Begin(ctx)
	require.NoError(t, err)
	ok, err := tx.(idemdriver.CompleteCommitter).CompleteCommit(ctx, completion(res.Record, 0))
	require.NoError(t, err)
	require.True(t, ok)
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "deferred-none"})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.Zero(t, d.Pool().Stat().AcquiredConns(), "every connection went back to the pool")
}

// A one-commit execution whose connection breaks once its completion and
// COMMIT have gone out (here a proxy drops the server's answer to the
// COMMIT, which the server has run) cannot know whether it committed: the
// answer says so (the retry gets the result if the commit took effect),
// not that the writes were rolled back, and the retry replays. Regression:
// the lost connection was reported as a failed completion, and the 503
// said the request's writes were rolled back with it, while they had
// committed.
func TestConnectionLostAfterThePipelinedCommit(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url + "&default_query_exec_mode=simple_protocol") // the SQL text on the wire
	require.NoError(t, err)
	proxy := newCutProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", proxy.port, nil
	cfg.MaxConns = 2
	d := storeOn(t, cfg, false)
	biz := newBusiness(t, d)
	m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[any](r.Context())
		require.NoError(t, err)
		require.NoError(t, biz.Insert(r.Context(), tx, "lost-row"))
		proxy.cut.Store(true) // the next COMMIT's answer never arrives
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set(idem.HeaderKey, "lost")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	first := send()
	require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
	require.Contains(t, first.Body.String(), "if the commit took effect")
	require.NotContains(t, first.Body.String(), "rolled back")
	n, err := biz.Count(context.Background(), "lost-row")
	require.NoError(t, err)
	require.Equal(t, 1, n, "the server ran the COMMIT")
	retry := send()
	require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
	require.Equal(t, "true", retry.Header().Get(idem.HeaderReplayed))
}

// cutProxy forwards TCP connections to a server. Once cut is set, the
// server's answer to the next client message that holds "commit" is not
// delivered: the connection is closed instead, after the server has read
// the message.
type cutProxy struct {
	port uint16
	cut  atomic.Bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	p := &cutProxy{port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go p.serve(c, s)
		}
	}()
	return p
}

func (p *cutProxy) serve(c, s net.Conn) {
	var committing atomic.Bool
	go func() { // client to server
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if p.cut.Load() && bytes.Contains(bytes.ToLower(buf[:n]), []byte("commit")) {
					committing.Store(true)
				}
				if _, werr := s.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
			if err != nil {
				_ = s.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for { // server to client
		n, err := s.Read(buf)
		if n > 0 && committing.Load() {
			p.cut.Store(false)
			err = errors.New("cut")
		} else if n > 0 {
			_, err = c.Write(buf[:n])
		}
		if err != nil {
			_ = c.Close()
			_ = s.Close()
			return
		}
	}
}
