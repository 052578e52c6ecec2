package idempgx_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
)

// waitEngines returns two engines on one database through pools of their
// own (two processes), whose waiters poll once an hour: only a notification
// wakes a waiter of the second for the first's outcome. Behind a transaction
// pooler (IDEMPGX_TEST_POOLER) nothing listens, and they poll every 100 ms.
func waitEngines(t *testing.T) (owner, other *idem.Engine, pool *pgxpool.Pool) {
	t.Helper()
	d := openDriver(t, false, nil)
	d2 := secondDriver(t, d).(*idempgx.Driver)
	poll := time.Hour
	if testPooler == "transaction" {
		require.False(t, d2.Notifies())
		poll = 100 * time.Millisecond
	}
	cfg := idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, Poll: poll}, Logger: slog.New(slog.DiscardHandler)}
	owner, err := idem.NewEngineWith(d, cfg)
	require.NoError(t, err)
	other, err = idem.NewEngineWith(d2, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close(); _ = other.Close() })
	return owner, other, d2.Pool()
}

func waitParams() idem.DoParams {
	return idem.DoParams{Scope: "acct", Key: "k", Payload: []byte("a")}
}

// runHeld runs the key's first execution on g until release is closed.
func runHeld(t *testing.T, g *idem.Engine) (release chan struct{}, done chan error) {
	started := make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), waitParams(), func(context.Context) (idem.Result, error) {
			close(started)
			<-release
			return idem.Result{Status: 201, Body: []byte("one")}, nil
		})
		done <- err
	}()
	<-started
	return release, done
}

// waiters starts n duplicates on g and returns their errors' channel once
// all of them wait.
func waiters(t *testing.T, g *idem.Engine, n int) chan error {
	out := make(chan error, n)
	var runs atomic.Int32
	for range n {
		go func() {
			res, err := g.Do(context.Background(), waitParams(), func(context.Context) (idem.Result, error) {
				runs.Add(1)
				return idem.Result{Status: 201, Body: []byte("two")}, nil
			})
			if err == nil && string(res.Body) != "one" {
				err = context.Canceled // a wrong answer: reported below
			}
			out <- err
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for g.Waiters() < n {
		require.True(t, time.Now().Before(deadline), "%d waiters, not %d", g.Waiters(), n)
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
	t.Cleanup(func() { require.Zero(t, runs.Load(), "no duplicate ran") })
	return out
}

// The commit of another process's execution wakes this process's waiters
// through LISTEN/NOTIFY: they poll once an hour, and get the answer.
func TestNotificationWakesAnotherProcess(t *testing.T) {
	owner, other, _ := waitEngines(t)
	release, done := runHeld(t, owner)
	out := waiters(t, other, 20)
	close(release)
	require.NoError(t, <-done)
	for range 20 {
		require.NoError(t, <-out)
	}
}

// A listener whose connection is killed reconnects, and the waiters read
// their record again once it listens: none misses the outcome.
func TestListenerReconnects(t *testing.T) {
	owner, other, pool := waitEngines(t)
	release, done := runHeld(t, owner)
	out := waiters(t, other, 5)
	if testPooler != "transaction" {
		killListener(t, pool)
	}
	// Reconnected (a second later) before the owner commits, or after it:
	// either way every waiter gets the answer, never an hour's poll.
	close(release)
	require.NoError(t, <-done)
	for range 5 {
		require.NoError(t, <-out)
	}
}

// killListener ends the connection that LISTENs on idem_keys.
func killListener(t *testing.T, pool *pgxpool.Pool) {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query ILIKE 'listen %' AND pid <> pg_backend_pid()`).Scan(&n))
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the listener's connection is found")
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
}

// Behind a transaction pooler, without Options.ListenConfig, the driver
// does not notify this process (its waiters poll); with it, it does.
func TestNotifiesBehindATransactionPooler(t *testing.T) {
	d := openDriver(t, false, nil)
	plain, err := idempgx.NewWithOptions(d.Pool(), idempgx.Options{})
	require.NoError(t, err)
	require.True(t, plain.Notifies())
	cfg := d.Pool().Config()
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as behind a transaction pooler
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pooled, err := idempgx.NewWithOptions(pool, idempgx.Options{TransactionPooler: true})
	require.NoError(t, err)
	require.False(t, pooled.Notifies())
	require.Error(t, pooled.Listen(t.Context(), func(bool) {}, func(string) {}))
	direct, err := idempgx.NewWithOptions(pool, idempgx.Options{TransactionPooler: true, ListenConfig: d.Pool().Config().ConnConfig})
	require.NoError(t, err)
	require.True(t, direct.Notifies())
}

// A closed engine starts no listener: its waiters poll, and get the answer.
func TestClosedEngineDoesNotListen(t *testing.T) {
	if testPooler == "transaction" {
		t.Skip("behind a transaction pooler nothing listens anyway")
	}
	d := openDriver(t, false, nil)
	cfg := d.Pool().Config()
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-closed-engine-test"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d2, err := idempgx.NewWithOptions(pool, idempgx.Options{Schema: d.Schema()})
	require.NoError(t, err)
	owner, err := idem.NewEngineWith(d, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close() })
	closed, err := idem.NewEngineWith(d2, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, Poll: 20 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	release, done := runHeld(t, owner)
	out := waiters(t, closed, 3)
	var listeners int
	require.NoError(t, d.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'idem-closed-engine-test' AND query ILIKE 'listen %'`).Scan(&listeners))
	require.Zero(t, listeners)
	close(release)
	require.NoError(t, <-done)
	for range 3 {
		require.NoError(t, <-out)
	}
}
